#pragma once
// The `nccl` backend: GPU ranks, one communicator per generation, created
// from a unique id (in-process, the group object carries it; across
// processes it goes through the generation's rendezvous store, See Note
// [NCCL's unique id through the store]). Communicators are
// non-blocking: set-up and every call are polled with deadlines and aborted
// on failure (See Note [Never block on a GPU collective]). Built only with
// the CUDA toolkit (DPACTOR_WITH_CUDA).

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comms/collective.hpp"
#include "comms/rendezvous_store.hpp"

namespace dpactor {

// `devices[r]` is rank r's CUDA device. NCCL refuses two ranks on one device.
std::shared_ptr<collective_group> make_nccl_group(std::vector<int> devices);

struct nccl_group_options {
  // The generation's keys live under this prefix of the store ("g7").
  std::string prefix = "g0";
  // How long a rank may wait for generation rank 0's unique id.
  std::chrono::milliseconds rendezvous_timeout{10'000};
};

// A group of `size` GPU ranks spread over processes: this process calls
// endpoint(r) for the ranks it hosts, rank r on CUDA device device_of(r).
// Rank 0's process makes the unique id; the others read it from `store`.
std::shared_ptr<collective_group> make_nccl_group(std::shared_ptr<rendezvous_store> store, int size,
                                                  std::function<int(int rank)> device_of, nccl_group_options options);

}  // namespace dpactor
