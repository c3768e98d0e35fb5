#pragma once
// Mutual TLS for the multi-node control plane (cluster.tls.*,
// docs/distributed.md "TLS"): whether a process uses it, its files checked
// before anything connects, and CAF's actor system set up with CAF's OpenSSL
// module. Gloo's data plane is not encrypted.
//
// Note [Refused TLS peers are logged]
// CAF's OpenSSL module verifies both ends (SSL_VERIFY_PEER |
// SSL_VERIFY_FAIL_IF_NO_PEER_CERT, the CA from cluster.tls.ca) but a failed
// handshake only closes the socket: its log is compiled out of Debian's
// build, and neither side learns why. So that both sides say why, this
// program defines SSL_CTX_set_verify itself (exported from the executable,
// it takes precedence over libssl's for CAF's calls): it calls libssl's with
// a verify callback that keeps the certificate's error, and adds an info
// callback that logs every fatal TLS alert, sent or received, with the peer's
// address. The most recent refusal is kept for the worker's own error
// message (last_tls_refusal). Verification itself is OpenSSL's, unchanged.

#include <string>

#include "config/job_config.hpp"

namespace caf {
class actor_system_config;
}

namespace dpactor {

// Whether the control plane to or at `coordinator_host` uses TLS:
// cluster.tls.mode, where auto means "unless the host is loopback".
bool tls_enabled(const tls_config& tls, const std::string& coordinator_host);

// With TLS on: throws config_error naming the key and file when the CA,
// certificate or key is missing, unreadable, not PEM, or when the key does
// not belong to the certificate; `why_on` says why TLS is on, for the
// message.
void check_tls_files(const tls_config& tls, const std::string& why_on);

// Loads CAF's OpenSSL module into `cfg` with the files of `tls`.
void use_tls(caf::actor_system_config& cfg, const tls_config& tls);

// The last TLS handshake this process refused or was refused in, as logged
// ("" if none since the last call); reading it clears it.
std::string take_last_tls_refusal();

}  // namespace dpactor
