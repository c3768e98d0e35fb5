#include "actors/tls.hpp"

#include <arpa/inet.h>
#include <pthread.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <atomic>
#include <mutex>
#include <string_view>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <dpactor/error.hpp>
#include "actors/log.hpp"

namespace dpactor {
namespace {

std::mutex refusal_mutex;
std::string last_refusal;

// The certificates use_tls was given: a context holding one is dpactor's.
std::mutex certificates_mutex;
std::vector<X509*> certificates;  // kept for the process's life
std::atomic<bool> tls_in_use{false};

// The certificate error of the handshake in progress on this thread (CAF
// runs a connection's handshake on one multiplexer thread), for the alert
// that follows it.
thread_local std::string verify_error;

// The peer's address, read when the handshake starts (the socket may be
// closed by the time an alert is logged) and kept with the connection.
int peer_index() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* p, CRYPTO_EX_DATA*, int, long, void*) { delete static_cast<std::string*>(p); });
  return index;
}

std::string address_of(const SSL* ssl) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int fd = SSL_get_fd(ssl);
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown address";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(in->sin6_port));
  }
  return "an unknown address";
}

int keep_verify_error(int ok, X509_STORE_CTX* ctx) {
  if (ok == 0) {
    char subject[256] = "no subject";
    if (X509* cert = X509_STORE_CTX_get_current_cert(ctx))
      X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof(subject));
    verify_error = std::string(X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx))) + ", certificate " + subject;
  }
  return ok;
}

const std::string& peer_of(const SSL* ssl) {
  auto* kept = static_cast<std::string*>(SSL_get_ex_data(ssl, peer_index()));
  if (kept == nullptr) {
    kept = new std::string(address_of(ssl));
    SSL_set_ex_data(const_cast<SSL*>(ssl), peer_index(), kept);
  }
  return *kept;
}

bool is_dpactor_context(const SSL_CTX* ctx) {
  X509* own = SSL_CTX_get0_certificate(ctx);
  if (own == nullptr) return false;
  std::lock_guard lock(certificates_mutex);
  return std::any_of(certificates.begin(), certificates.end(), [&](X509* c) { return X509_cmp(c, own) == 0; });
}

void log_alerts(const SSL* ssl, int where, int value) {
  if (!is_dpactor_context(SSL_get_SSL_CTX(ssl))) return;
  peer_of(ssl);  // the first callback of a connection: its peer is still there
  // Only refusals: after the handshake, an alert is a connection ending,
  // which CAF reports as the peer's loss.
  if ((where & SSL_CB_ALERT) == 0 || std::string(SSL_alert_type_string(value)) != "F" || SSL_is_init_finished(ssl) == 1)
    return;
  const bool sent = (where & SSL_CB_WRITE) != 0;
  const bool server = SSL_is_server(const_cast<SSL*>(ssl)) == 1;
  const std::string& peer = peer_of(ssl);
  // Refusals are about certificates and the handshake's terms; other
  // alerts (a decode error as a peer exits mid-handshake) are no verdict.
  const int code = value & 0xff;
  if (code != 40 && (code < 42 || code > 49 || code == 47) && code != 51 && code != 70 && code != 116) {
    engine_log()->debug("TLS handshake with {} ended: {}", peer_of(ssl), SSL_alert_desc_string_long(value));
    verify_error.clear();
    return;
  }
  const std::string desc = code == 116 ? "certificate required (no certificate was sent)" : SSL_alert_desc_string_long(value);
  const std::string detail = verify_error.empty() ? "" : " (" + verify_error + ")";
  verify_error.clear();
  std::string what;
  if (sent && server) what = "refused a TLS peer at " + peer + ": " + desc + detail;
  else if (sent) what = "refused the TLS certificate of the coordinator at " + peer + ": " + desc + detail;
  else if (server) what = "the TLS peer at " + peer + " ended the handshake: " + desc;
  else what = "the coordinator at " + peer + " refused this process's TLS certificate: " + desc;
  engine_log()->error("{} (cluster.tls.*)", what);
  std::lock_guard lock(refusal_mutex);
  last_refusal = what;
}

bool on_a_caf_thread() {
  char name[16] = {};
  return ::pthread_getname_np(::pthread_self(), name, sizeof(name)) == 0 && std::string_view(name).starts_with("caf.");
}

// The ex-data "new" callback: runs inside SSL_CTX_new, before CAF configures
// the context (See Note [Refused TLS peers are logged]).
void on_new_context(void* parent, void*, CRYPTO_EX_DATA*, int, long, void*) {
  if (!tls_in_use.load(std::memory_order_acquire) || parent == nullptr || !on_a_caf_thread()) return;
  auto* ctx = static_cast<SSL_CTX*>(parent);
  SSL_CTX_set_info_callback(ctx, log_alerts);
  X509_STORE_set_verify_cb(SSL_CTX_get_cert_store(ctx), keep_verify_error);
}

void watch_new_contexts(const tls_config& tls) {
  X509* cert = nullptr;
  if (std::FILE* f = std::fopen(tls.certificate.c_str(), "r")) {
    cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
    std::fclose(f);
  }
  if (cert != nullptr) {
    std::lock_guard lock(certificates_mutex);
    certificates.push_back(cert);
  }
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, on_new_context, nullptr, nullptr);
  (void)index;
  tls_in_use.store(true, std::memory_order_release);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string openssl_error() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof(text));
    out += (out.empty() ? "" : "; ") + std::string(text);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

}  // namespace

bool tls_enabled(const tls_config& tls, const std::string& coordinator_host) {
  switch (tls.mode) {
    case tls_mode::on: return true;
    case tls_mode::off: return false;
    case tls_mode::automatic: return !is_loopback(coordinator_host);
  }
  return true;
}

void check_tls_files(const tls_config& tls, const std::string& why_on) {
  std::string missing;
  for (const auto& [key, value] : {std::pair{"cluster.tls.ca", &tls.ca}, std::pair{"cluster.tls.certificate", &tls.certificate},
                                   std::pair{"cluster.tls.key", &tls.key}})
    if (value->empty()) missing += (missing.empty() ? "" : ", ") + std::string(key);
  if (!missing.empty())
    throw config_error(why_on + ", which needs cluster.tls.ca, cluster.tls.certificate and cluster.tls.key; " + missing +
                       " not set (or cluster.tls.mode = \"off\" on a trusted network; docs/distributed.md, TLS)");
  for (const auto& [key, value] : {std::pair{"cluster.tls.ca", &tls.ca}, std::pair{"cluster.tls.certificate", &tls.certificate},
                                   std::pair{"cluster.tls.key", &tls.key}}) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*value, ec))
      throw config_error(std::string(key) + " = " + *value + ": no such file");
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) throw config_error("TLS: cannot create an OpenSSL context: " + openssl_error());
  const auto fail = [&](const std::string& what) {
    const std::string why = openssl_error();
    SSL_CTX_free(ctx);
    throw config_error(what + " (" + why + ")");
  };
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(ctx, tls.ca.c_str(), nullptr) != 1)
    fail("cluster.tls.ca = " + tls.ca + ": not a PEM CA certificate");
  if (SSL_CTX_use_certificate_chain_file(ctx, tls.certificate.c_str()) != 1)
    fail("cluster.tls.certificate = " + tls.certificate + ": not a PEM certificate");
  EVP_PKEY* key = nullptr;
  if (std::FILE* f = std::fopen(tls.key.c_str(), "r")) {
    key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
    std::fclose(f);
  }
  if (key == nullptr) fail("cluster.tls.key = " + tls.key + ": not an unencrypted PEM private key");
  const bool belongs = SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  if (!belongs) fail("cluster.tls.key = " + tls.key + ": does not belong to cluster.tls.certificate = " + tls.certificate);
  // The process's own certificate must pass the check its peers make.
  X509_STORE_CTX* check = X509_STORE_CTX_new();
  X509* own = SSL_CTX_get0_certificate(ctx);
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(ctx, &chain);
  const bool ok = check != nullptr && X509_STORE_CTX_init(check, SSL_CTX_get_cert_store(ctx), own, chain) == 1 &&
                  X509_verify_cert(check) == 1;
  const std::string why = check == nullptr ? "" : X509_verify_cert_error_string(X509_STORE_CTX_get_error(check));
  X509_STORE_CTX_free(check);
  SSL_CTX_free(ctx);
  if (!ok)
    throw config_error("cluster.tls.certificate = " + tls.certificate + ": does not pass the check against cluster.tls.ca = " +
                       tls.ca + " that every peer makes: " + why);
}

void use_tls(caf::actor_system_config& cfg, const tls_config& tls) {
  watch_new_contexts(tls);
  cfg.load<caf::openssl::manager>();
  cfg.openssl_cafile = tls.ca;
  cfg.openssl_certificate = tls.certificate;
  cfg.openssl_key = tls.key;
}

std::string take_last_tls_refusal() {
  std::lock_guard lock(refusal_mutex);
  return std::exchange(last_refusal, std::string());
}

}  // namespace dpactor
