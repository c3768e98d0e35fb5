#pragma once
// Forming a generation's Gloo group: what the group's ranks in this process
// share (the store, the options, and everything an abort must reach), and one
// rank's connections to every other, made through the store: a TCP pair per
// peer and, with peers on the same machine, shared memory (See Note
// [Same-machine ranks share memory], comms/shm_segment.hpp). The operations
// over these connections are comms/gloo.cpp's.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comms/collective.hpp"
#include "comms/gloo.hpp"
#include "comms/gloo_wait_alarm.hpp"
#include "comms/rendezvous_store.hpp"
#include "comms/shm_segment.hpp"

namespace gloo {
class Context;
namespace transport {
class Context;
class UnboundBuffer;
namespace tcp {
class Context;
}
}  // namespace transport
}  // namespace gloo

namespace dpactor {

// See Note [Gloo waits look up every health_slice]: how late a rank notices
// an abort or a broken connection that Gloo did not report.
inline constexpr std::chrono::milliseconds gloo_health_slice{5};
// How long a message that may already be there gets to show it: after a
// connection closed, and for each peer still missing at a call's late_at.
inline constexpr std::chrono::milliseconds gloo_late_probe{2};

// What a group's ranks in this process share. abort() (any thread) marks the
// group and fails everything pending on every local rank's connections:
// peers see their calls fail within milliseconds.
class gloo_group_state {
 public:
  using clock = std::chrono::steady_clock;
  gloo_group_state(std::shared_ptr<rendezvous_store> store, int size, gloo_group_options options)
      : store(std::move(store)), size(size), options(std::move(options)) {}

  const std::shared_ptr<rendezvous_store> store;
  const int size;
  const gloo_group_options options;
  std::atomic<bool> aborted{false};

  // Idempotent; the first reason is kept.
  void abort(const std::string& reason);
  std::string reason();
  // Aborts the group and throws collective_error(code), naming the rank.
  [[noreturn]] void fail(int rank, collective_errc code, const std::string& what);

  // Registers a rank's connections for abort(); false if the group is
  // already aborted (then nothing was registered).
  bool enlist(gloo::transport::tcp::Context* transport);
  void discharge(gloo::transport::tcp::Context* transport);
  // Registers a segment for abort(); aborts it at once if the group is.
  void enlist(shm_segment* segment);
  void discharge(shm_segment* segment);

  // A store get in slices, so that an abort is seen within store_poll_slice;
  // fails the group (as `rank`) at the deadline.
  std::vector<char> store_get(const std::string& key, clock::time_point deadline, int rank);

 private:
  std::mutex mutex_;  // guards why_, transports_ and segments_
  std::string why_;
  std::vector<gloo::transport::tcp::Context*> transports_;  // the local ranks', for abort
  std::vector<shm_segment*> segments_;  // every segment a local rank mapped, for abort
};

// One rank's connections to the other ranks of its group.
class gloo_connection {
 public:
  using clock = std::chrono::steady_clock;
  gloo_connection(std::shared_ptr<gloo_group_state> group, int rank);
  ~gloo_connection();
  gloo_connection(const gloo_connection&) = delete;
  gloo_connection& operator=(const gloo_connection&) = delete;

  // Connects to every other rank through the store (publishes one address
  // per peer, reads each peer's address for this rank), then pairs up the
  // peers on this machine over shared memory. Throws collective_error, the
  // group then aborted. Once called, what it made lives until destruction.
  void connect(clock::time_point deadline);
  bool started() const noexcept { return transport_ != nullptr; }

  gloo::Context& context() noexcept;
  // A Gloo buffer over `bytes` at `data`, for sends to and receives from peers.
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer(void* data, std::size_t bytes);
  // Throws gloo::IoException when the connection to `peer` has failed.
  void probe(int peer);
  // Waits for one receive or send of `buffer`, all with `peer` (See Note
  // [Gloo waits look up every health_slice]): true when it completed, false
  // when `late_at` came first (then it is still pending). Throws on an
  // abort, a failure of the connection, or at the deadline.
  bool wait(gloo::transport::UnboundBuffer& buffer, wait_alarm::kind k, int peer, clock::time_point deadline,
            std::optional<clock::time_point> late_at = std::nullopt);
  // What waits on shared memory check the same way.
  const shm_health& health() const noexcept { return health_; }
  // The peers reached through shared memory; null when none is.
  shm_exchange* shared_memory() noexcept { return shm_.get(); }
  int shared_memory_peers() const noexcept { return shm_ ? shm_->peer_count() : 0; }

 private:
  std::string key(const char* what, int rank) const;
  void prefetch(const char* what);
  void share_memory(bool enabled, clock::time_point deadline);
  bool interrupted_wait(gloo::transport::UnboundBuffer& buffer, wait_alarm::kind k, clock::time_point wake,
                        clock::time_point deadline);

  std::shared_ptr<gloo_group_state> group_;
  const int rank_;
  // Enlisted for abort() from the start of connect().
  std::shared_ptr<gloo::transport::Context> transport_owner_;
  gloo::transport::tcp::Context* transport_ = nullptr;
  std::unique_ptr<gloo::Context> context_;
  char probe_byte_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe_;  // probe()'s, never receives
  std::unique_ptr<shm_exchange> shm_;
  shm_health health_;
  wait_alarm alarm_;
};

}  // namespace dpactor
