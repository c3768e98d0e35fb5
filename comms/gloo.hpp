#pragma once
// The `gloo` backend: CPU ranks in separate processes (or nodes), over Gloo's
// TCP transport. One group per generation: its ranks find each other through
// a rendezvous store (See Note [Rendezvous store]) under the generation's
// prefix, and each rank connects to every other.
//
// Note [Gloo sums like the local backend]
// Gloo's own algorithms sum in ring or halving-doubling order, which depends
// on the number of ranks (and its halving-doubling reduce-scatter gave wrong
// chunks at 3-5 ranks when this backend was written). Here every rank
// instead sends chunk c of its buffer straight to rank c, which sums the chunks in rank
// order with the local backend's own function (comms/rank_order.hpp) and
// sends the sum back to every rank. The bytes are therefore those the local
// backend computes from the same buffers, whether the ranks are threads or
// processes, and the traffic is a ring's: (n-1)/n of the buffer out and in,
// twice. reduce_scatter_tree sends each part's chunk c to rank c in the same
// way and evaluates the summation tree there. all_reduce_tree (See Note [One
// call a step], comms/collective.hpp) carries the step header in the call's
// own header, and between two ranks holding one node each sends each part
// whole, each rank evaluating the whole tree: the same bytes on the wire,
// one round trip fewer.
//
// Every call opens with a header exchange (operation, size, root, and the
// buffer sizes or tree nodes) from each rank to each other: it is the
// barrier, it finds ranks called with different sizes before any payload
// moves (a payload larger than the receiver posted would stop Gloo's event
// loop), and it is where a rank waiting past options.late_at learns who has
// not arrived.
//
// Failures: abort() (any thread) marks the group and signals every local
// rank's connections (tcp::Context::signalException, which fails every
// pending operation on every pair and closes the sockets: peers see their
// calls fail within milliseconds); a rank whose call fails for any other
// reason (a peer died, a timeout) aborts the whole group the same way, so the
// failure reaches every rank in one hop. A rank waiting in rendezvous sees an
// abort within store_poll_slice.
//
// Memory: a call hands Gloo the caller's buffers and, before it returns in
// any way, destroys the buffers' Gloo handles, whose destructor waits until
// Gloo's event loop no longer touches the memory (See Note [Posted memory
// outlives an abort]).
//
// No process-wide effect: Gloo writes to sockets without MSG_NOSIGNAL, and
// instead of ignoring SIGPIPE for the process, the threads that write block
// it (See Note [SIGPIPE without a process-wide disposition],
// comms/gloo_process.hpp).

#include <chrono>
#include <memory>
#include <string>

#include "comms/collective.hpp"
#include "comms/rendezvous_store.hpp"

namespace dpactor {

struct gloo_group_options {
  // The generation's keys live under this prefix of the store ("g7").
  std::string prefix = "g0";
  // The address this process's ranks listen on and are reached at (Gloo
  // would otherwise take the host name's, 127.0.1.1 on Debian).
  std::string address = "127.0.0.1";
  // How long forming the group may take: store waits and connections.
  std::chrono::milliseconds rendezvous_timeout{10'000};
  // Ranks in processes of one machine exchange through shared memory (See
  // Note [Same-machine ranks share memory]); false keeps every pair on TCP.
  bool shared_memory = true;
};

// A group of `size` ranks spread over processes. This process calls
// endpoint(r) for the ranks it hosts, each on the thread that uses it; the
// endpoint connects on its first call. The store's keys under the prefix are
// the caller's to erase once the generation is over.
std::shared_ptr<collective_group> make_gloo_group(std::shared_ptr<rendezvous_store> store, int size,
                                                  gloo_group_options options);

// How many peers a gloo endpoint reaches through shared memory (See Note
// [Same-machine ranks share memory]): known after its first call; 0 for an
// endpoint of another backend.
int gloo_shared_memory_peers(const collective& endpoint) noexcept;

}  // namespace dpactor
