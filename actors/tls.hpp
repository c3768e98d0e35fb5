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
// build, and neither side learns why. CAF 0.17 offers no hook into the
// contexts it makes (caf::openssl::session::create_ssl_context), so dpactor
// uses OpenSSL's own per-object hook: an SSL_CTX ex-data index whose "new"
// callback runs inside SSL_CTX_new. Once a TLS engine has been set up in the
// process (use_tls), a context created on one of CAF's threads (named
// "caf.*": the middleman's, which connects, and the multiplexer, which
// accepts) gets an info callback that logs every fatal TLS alert, sent or
// received, with the peer's address, and its certificate store a verify
// callback that keeps the certificate's error for that line (CAF sets no
// verify callback of its own, so the store's is the one OpenSSL calls). The
// info callback logs only for contexts holding the certificate use_tls was
// given. Contexts made on any other thread, the host's own, are never
// touched; no libssl symbol is replaced. The most recent refusal is kept for
// the worker's own error message (take_last_tls_refusal). Verification
// itself is OpenSSL's, unchanged.

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
