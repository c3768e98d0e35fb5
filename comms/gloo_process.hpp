#pragma once
// What the gloo backend sets up once per process, for every generation's
// groups: one TCP device (its event-loop thread) per address, the sweep of
// shared-memory segments that killed processes left, and SIGPIPE.

#include <memory>
#include <string>

namespace gloo::transport {
class Device;
}

namespace dpactor {

// The TCP device of this process for `address`, made on first use and kept
// to the end of the process: destroying a device at exit, after its users,
// gains nothing.
std::shared_ptr<gloo::transport::Device> gloo_tcp_device(const std::string& address);

// Before the first group. Process-wide effect: SIGPIPE is ignored, because
// Gloo writes to sockets without MSG_NOSIGNAL and a peer's death would
// otherwise kill this process.
void prepare_process_for_gloo();

// Before the first group that shares memory: removes the segments of
// processes that died during a rendezvous (See sweep_stale_segments).
void sweep_shared_memory_once();

}  // namespace dpactor
