#pragma once
// What every process of a multi-node job sets up the same way: the actor
// system with CAF's networking, heartbeats so that a silent peer is dropped,
// and the application identifier that refuses a peer of another version; and
// the local address that faces the coordinator, for Gloo's connections.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/all.hpp>

namespace dpactor {

// make_system_config() plus CAF's middleman: BASP heartbeats every
// `heartbeat`, and a peer silent for `connection_timeout` is dropped (its
// actors go down with remote_link_unreachable). Both 0: off.
std::unique_ptr<caf::actor_system_config> make_network_config(std::chrono::milliseconds heartbeat,
                                                              std::chrono::milliseconds connection_timeout);

// This machine's address on the route to host:port (a UDP socket connected
// there, never sent on), so that peers can reach Gloo's connections. Falls
// back to 127.0.0.1 for a loopback host. Throws std::runtime_error when the
// host cannot be resolved.
std::string facing_address(const std::string& host, std::uint16_t port);

}  // namespace dpactor
