#pragma once
// What the gloo backend sets up once per process, for every generation's
// groups: one TCP device (its event-loop thread) per address, and the sweep
// of shared-memory segments that killed processes left; and how a thread
// writes to Gloo's sockets without SIGPIPE.
//
// Note [SIGPIPE without a process-wide disposition]
// Gloo writes to its sockets with writev, without MSG_NOSIGNAL, so a write
// to a peer that died raises SIGPIPE, whose default action ends the process.
// Instead of ignoring SIGPIPE for the whole process (the host's own sockets
// included), the threads that write are the ones that block it: the TCP
// device's event-loop thread from its start (it inherits the mask of the
// thread that creates it), and a caller's thread for the length of each
// collective call (sigpipe_guard), which on leaving consumes a SIGPIPE that
// became pending on it (a write's SIGPIPE is sent to the writing thread) and
// restores the thread's mask. The write then fails with EPIPE, which Gloo
// reports as an error of the call, as it should.

#include <csignal>
#include <memory>
#include <string>

namespace gloo::transport {
class Device;
}

namespace dpactor {

// The TCP device of this process for `address`, made on first use and kept
// to the end of the process: destroying a device at exit, after its users,
// gains nothing. Its event-loop thread has SIGPIPE blocked for good.
std::shared_ptr<gloo::transport::Device> gloo_tcp_device(const std::string& address);

// Before the first group that shares memory: removes the segments of
// processes that died during a rendezvous (See sweep_stale_segments).
void sweep_shared_memory_once();

// Blocks SIGPIPE in this thread for its lifetime; on destruction consumes a
// SIGPIPE pending on the thread and restores its mask (See Note [SIGPIPE
// without a process-wide disposition]).
class sigpipe_guard {
 public:
  sigpipe_guard() noexcept;
  ~sigpipe_guard();
  sigpipe_guard(const sigpipe_guard&) = delete;
  sigpipe_guard& operator=(const sigpipe_guard&) = delete;

 private:
  sigset_t previous_;
  bool was_blocked_ = false;
};

}  // namespace dpactor
