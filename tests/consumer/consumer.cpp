// A host process embedding dpactor through its installed package only
// (tests/consumer/check.sh): it trains a job that coordinates under mutual
// TLS, serves it through the HTTP adapter, predicts, and checks what the
// engine left of its process. Prints "consumer: ok" and exits 0, or names
// the first check that failed and exits 1.
//
//   consumer CONFIG TLS_DIR SCRATCH_DIR

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <openssl/ssl.h>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include <dpactor/http.hpp>
#include <dpactor/log.hpp>
#include <dpactor/snapshot.hpp>
#include <dpactor/version.hpp>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

std::atomic<int> host_info_calls{0};
void host_info(const SSL*, int, int) { ++host_info_calls; }
void other_host_info(const SSL*, int, int) {}

// The host's own TLS client context: its own CA, certificate and info callback.
SSL_CTX* host_context(const std::string& tls) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_load_verify_locations(ctx, (tls + "/ca.pem").c_str(), nullptr);
  SSL_CTX_use_certificate_chain_file(ctx, (tls + "/worker.pem").c_str());
  SSL_CTX_use_PrivateKey_file(ctx, (tls + "/worker.key").c_str(), SSL_FILETYPE_PEM);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_info_callback(ctx, host_info);
  return ctx;
}

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One HTTP/1.1 request on 127.0.0.1; the whole response.
std::string http(std::uint16_t port, const std::string& method, const std::string& path, const std::string& body = "") {
  const int fd = connect_to(port);
  if (fd < 0) return "";
  const std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                              "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                              "\r\n\r\n" + body;
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) response.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return response;
}

// A TLS handshake, with the host's context, with the coordinator's CAF
// endpoint: true when it completed (the coordinator accepted the host's
// certificate, and the host the coordinator's).
bool tls_handshake(SSL_CTX* ctx, std::uint16_t port) {
  const int fd = connect_to(port);
  if (fd < 0) return false;
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  const bool ok = SSL_connect(ssl) == 1;
  SSL_free(ssl);
  ::close(fd);
  return ok;
}

struct sigaction sigpipe_now() {
  struct sigaction now{};
  ::sigaction(SIGPIPE, nullptr, &now);
  return now;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CONFIG TLS_DIR SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  const std::string config_file = argv[1], tls = argv[2], scratch = argv[3];
  std::printf("consumer: dpactor %s\n", dpactor::version);

  // Before any engine: the host's own TLS context and SIGPIPE's disposition.
  SSL_CTX* before = host_context(tls);
  const struct sigaction sigpipe_before = sigpipe_now();

  // The host's logger.
  std::mutex log_mutex;
  std::vector<std::string> lines;
  dpactor::set_log_handler([&](dpactor::log_level, std::string_view line) {
    std::lock_guard lock(log_mutex);
    lines.emplace_back(line);
  });

  dpactor::job_config config = dpactor::load_job_config(
      config_file, {"data.format=\"synthetic\"", "data.synthetic_train=4096", "data.synthetic_test=512",
                    "model.layers=[16, 32, 4]", "train.epochs=3", "train.batch_size=64", "cluster.cpus=2",
                    "train.checkpoint_dir=\"" + scratch + "/checkpoints\"", "service.listen=\"127.0.0.1:0\"",
                    "service.snapshot_every_s=0.05", "cluster.tls.mode=\"on\"", "cluster.tls.ca=\"" + tls + "/ca.pem\"",
                    "cluster.tls.certificate=\"" + tls + "/coordinator.pem\"",
                    "cluster.tls.key=\"" + tls + "/coordinator.key\""});
  dpactor::run_options options;
  dpactor::coordinator_options coordinator;
  coordinator.wait_devices = 2;  // its own two CPU replicas
  std::atomic<std::uint16_t> coordinator_port{0};
  coordinator.on_listening = [&](const std::string& address) {
    coordinator_port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  };
  options.coordinator = coordinator;
  dpactor::Engine engine(config, options);
  std::atomic<std::int64_t> steps{0};
  engine.on_event([&](const dpactor::event& e) {
    if (const auto* x = std::get_if<dpactor::epoch_event>(&e)) steps = x->step;
  });
  dpactor::http_face face(engine);

  // Typed errors before a run.
  try {
    engine.members();
    check(false, "members() without a run throws");
  } catch (const dpactor::error& e) {
    check(e.code() == dpactor::error_kind::no_run, std::string("members() without a run: code no_run: ") + e.what());
  }

  engine.start();
  // The host's TLS context handshakes with the engine's TLS endpoint: both
  // ends verify, and the host's own info callback is the one it hears.
  check(coordinator_port != 0, "the coordinator said where it listens");
  check(tls_handshake(before, coordinator_port), "the host's TLS client completes a handshake with the engine");
  check(host_info_calls > 0, "the host's info callback heard its own handshake");
  check(SSL_CTX_get_info_callback(before) == host_info, "the host's context made before the run keeps its info callback");
  SSL_CTX* during = SSL_CTX_new(TLS_client_method());
  check(SSL_CTX_get_info_callback(during) == nullptr, "a context the host makes during the run gets no callback of dpactor's");
  SSL_CTX_free(during);

  // The HTTP adapter: /metrics, and a prediction once parameters are copied.
  std::string metrics;
  for (int i = 0; i < 200 && metrics.find("dpactor_steps_total") == std::string::npos; ++i) {
    metrics = http(face.port(), "GET", "/metrics");
    usleep(50'000);
  }
  check(metrics.find("HTTP/1.1 200") == 0 && metrics.find("dpactor_steps_total") != std::string::npos,
        "GET /metrics through the adapter: " + metrics.substr(0, 200));
  std::string features = "{\"features\": [";
  for (int i = 0; i < 16; ++i) features += (i ? ", " : "") + std::to_string(0.1 * i);
  features += "]}";
  std::string prediction;
  for (int i = 0; i < 200 && prediction.find("\"class\"") == std::string::npos; ++i) {
    prediction = http(face.port(), "POST", "/predict", features);
    usleep(50'000);
  }
  check(prediction.find("HTTP/1.1 200") == 0 && prediction.find("\"class\"") != std::string::npos,
        "POST /predict through the adapter: " + prediction.substr(0, 300));
  try {
    engine.remove_device("cpu:99");
    check(false, "remove_device of no member throws");
  } catch (const dpactor::error& e) {
    check(e.code() == dpactor::error_kind::unknown_device || e.code() == dpactor::error_kind::run_ended,
          std::string("remove_device of no member: code unknown_device: ") + e.what());
  }

  const dpactor::run_summary summary = engine.wait();
  std::printf("consumer: trained %lld steps, test accuracy %.3f, /predict said %s\n",
              static_cast<long long>(summary.steps), summary.test_accuracy,
              prediction.substr(prediction.find("\r\n\r\n") + 4).c_str());
  check(summary.steps > 0 && summary.steps == steps, "the summary counts the steps the last epoch event showed");
  check(summary.test_accuracy > 0.5, "the job learned (test accuracy " + std::to_string(summary.test_accuracy) + ")");

  // Predictions from the last snapshot, in the host's own code.
  const auto last = engine.latest_snapshot();
  check(last != nullptr, "a snapshot stays after the run");
  if (last) {
    std::vector<float> x(16 * 3, 0.25f);
    const std::vector<float> scores = dpactor::predict(engine.config(), *last, x);
    check(scores.size() == 3 * 4, "predict: 3 rows of 4 scores");
    try {
      dpactor::predict(engine.config(), *last, std::vector<float>(15, 0.0f));
      check(false, "predict of a partial row throws");
    } catch (const dpactor::error& e) {
      check(e.code() == dpactor::error_kind::invalid_argument, "predict of a partial row: invalid_argument");
    }
  }
  try {
    engine.snapshot();
    check(false, "snapshot() after the run throws");
  } catch (const dpactor::error& e) {
    check(e.code() == dpactor::error_kind::no_run, "snapshot() after the run: code no_run");
  }

  // After the run: the host's contexts and signals are as they were.
  check(SSL_CTX_get_info_callback(before) == host_info, "the host's context keeps its info callback after the run");
  SSL_CTX* after = SSL_CTX_new(TLS_client_method());
  check(SSL_CTX_get_info_callback(after) == nullptr, "a context made after the run gets no callback of dpactor's");
  SSL_CTX_set_info_callback(after, other_host_info);
  check(SSL_CTX_get_info_callback(after) == other_host_info, "a context made after the run takes the host's callback");
  SSL_CTX_free(after);
  SSL_CTX_free(before);
  Dl_info where{};
  check(::dladdr(reinterpret_cast<void*>(&SSL_CTX_set_verify), &where) != 0 && where.dli_fname != nullptr &&
            std::strstr(where.dli_fname, "libssl") != nullptr,
        std::string("SSL_CTX_set_verify is libssl's: ") + (where.dli_fname ? where.dli_fname : "?"));
  const struct sigaction sigpipe_after = sigpipe_now();
  check(sigpipe_after.sa_handler == sigpipe_before.sa_handler && sigpipe_after.sa_flags == sigpipe_before.sa_flags,
        "SIGPIPE's disposition is unchanged after the run");
  {
    std::lock_guard lock(log_mutex);
    check(!lines.empty(), "the engine logged through the host's handler");
  }
  dpactor::set_log_handler({});
  if (failures != 0) return 1;
  std::printf("consumer: ok\n");
  return 0;
}
