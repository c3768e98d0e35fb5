#pragma once
// The `local` backend: ranks are threads of one process sharing memory.
// All-reduce works straight on the ranks' own buffers: rank r sums chunk r of
// every buffer in rank order 0..n-1 and writes the sum into every buffer, so
// every rank ends with bitwise the same sum (See Note [Bitwise identical
// replicas]) after two barriers. No sockets, no staging copies: every call is
// an exchange between an opening and a closing barrier, and the closing one
// keeps each rank's memory in use until no peer can touch it, even after an
// abort (See Note [Posted memory outlives an abort]).

#include <chrono>
#include <functional>
#include <memory>

#include "comms/collective.hpp"

namespace dpactor {

// Note [Bitwise identical replicas]
// Replicas stay bitwise identical only if every rank applies the optimizer to
// bitwise identical gradients. Each element of a reduced buffer is therefore
// computed once, by one rank, in rank order, and copied to the others; no rank
// sums in its own order. Backends that cannot promise this (NCCL does, for a
// fixed communicator and size) must say so.

struct local_group_options {
  // How long a rank spins at a barrier before it sleeps.
  std::chrono::microseconds spin_time{200};
  // Set when there are more ranks than cores: spinning then yields the core.
  bool oversubscribed = false;
  // After an abort, how long a rank waits for its peers to stop touching its
  // memory before it declares the group poisoned and stops the process (See
  // Note [Posted memory outlives an abort]). Peers leave within microseconds
  // unless their thread is not scheduled at all.
  std::chrono::milliseconds drain_bound{10'000};
  // For tests only: called on each rank's thread inside the phase in which it
  // touches the other ranks' memory.
  std::function<void(int rank)> phase_hook;
};

std::shared_ptr<collective_group> make_local_group(int ranks, local_group_options options = {});

}  // namespace dpactor
