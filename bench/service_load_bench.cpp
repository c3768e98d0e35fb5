// Serving while training (issue 15, acceptance 3): the default job's
// training throughput alone and under a steady load of HTTP requests to the
// same process, side by side, alternating, with the latency of each
// endpoint and the process's memory. The client runs in the process too, so
// its own CPU time counts against training: an upper bound on the cost.
//
//   build/bin/service_load_bench [--config configs/mlp.cfg] [--seconds 60] [--rate 500] [--rounds 2] [--client-nice N] [--server-nice N] [--cpus N]
//
// Load: `rate` requests/s over 4 keep-alive connections on loopback, in turn
// GET /metrics, GET /status and POST /predict (the latest parameters).
// Each round trains unobserved, then under load, each window `seconds`
// long after 3 s of warm-up; the machine's own drift between windows is of
// the order of the effect, so compare the rounds' ratios, not one window.

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <dpactor/engine.hpp>
#include "config/config_file.hpp"
#include "service/event_feed.hpp"
#include "service/feature_body.hpp"
#include "service/http_service.hpp"
#include "service/metrics_board.hpp"
#include "tensors/mlp.hpp"

using namespace dpactor;
namespace asio = boost::asio;
namespace http = boost::beast::http;
using clock_type = std::chrono::steady_clock;

namespace {

double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct window {
  double samples_per_s = 0;
  std::map<std::string, std::vector<double>> latency_ms;  // by endpoint
  std::int64_t requests = 0, errors = 0;
  double rss_start = 0, rss_mid = 0, rss_max = 0, rss_end = 0;
};

http_reply predict(const Engine& engine, const mlp_spec& spec, const http_request_view& req) {
  const auto snap = engine.latest_snapshot();
  if (!snap) return json_error(503, "no parameters yet");
  const auto x = parse_feature_body(req.body);
  if (x.size() != static_cast<std::size_t>(spec.inputs())) return json_error(400, "wrong feature count");
  thread_local std::unique_ptr<mlp> model;
  if (!model) model = std::make_unique<mlp>(spec, 1);
  std::vector<float> logits(static_cast<std::size_t>(spec.outputs()));
  model->predict(snap->values.data(), x.data(), 1, logits.data());
  return {200, json{{"class", std::max_element(logits.begin(), logits.end()) - logits.begin()}, {"version", snap->step}}.dump()};
}

// The load: `rate` requests/s, each endpoint in turn, until `until`.
void load(std::uint16_t port, double rate, clock_type::time_point until, const std::string& predict_body, window& w,
          std::mutex& m, int nice) {
  if (nice >= 20) {
    sched_param p{};
    ::sched_setscheduler(::gettid(), SCHED_IDLE, &p);
  } else if (nice != 0) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
  }
  asio::io_context io;
  std::vector<asio::ip::tcp::socket> sockets;
  for (int i = 0; i < 4; ++i) {
    sockets.emplace_back(io);
    sockets.back().connect({asio::ip::make_address("127.0.0.1"), port});
  }
  const char* paths[] = {"/metrics", "/status", "/predict"};
  boost::beast::flat_buffer buffer;
  auto next = clock_type::now();
  for (std::int64_t i = 0; clock_type::now() < until; ++i) {
    std::this_thread::sleep_until(next);
    next += std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(1.0 / rate));
    const std::string path = paths[i % 3];
    http::request<http::string_body> req{path == "/predict" ? http::verb::post : http::verb::get, path, 11};
    req.set(http::field::host, "127.0.0.1");
    if (path == "/predict") req.body() = predict_body;
    req.prepare_payload();
    auto& s = sockets[static_cast<std::size_t>(i) % sockets.size()];
    const auto start = clock_type::now();
    http::response<http::string_body> res;
    boost::system::error_code ec;
    http::write(s, req, ec);
    if (!ec) http::read(s, buffer, res, ec);
    const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
    std::lock_guard lock(m);
    ++w.requests;
    if (ec || res.result_int() != 200) ++w.errors;
    else w.latency_ms[path].push_back(ms);
  }
}

int client_nice = 0;  
int server_nice = 10;  // --server-nice (20: SCHED_IDLE)  // --client-nice: the load's client thread (19: as if it ran on another machine)

window run_window(const job_config& config, double seconds, double rate) {
  window w;
  std::mutex m;
  Engine engine(config);
  auto board = std::make_shared<metrics_board>();
  auto feed = std::make_shared<event_feed>();
  std::vector<std::pair<clock_type::time_point, std::int64_t>> steps;
  engine.on_event([&](const event& e) {
    board->on_event(e);
    feed->on_event(e);
    if (const auto* s = std::get_if<step_event>(&e)) {
      std::lock_guard lock(m);
      steps.emplace_back(clock_type::now(), s->step);
    }
  });
  std::unique_ptr<http_service> server;
  if (rate > 0) {
    http_service_options o;
    o.thread_nice = server_nice;
    o.events = feed;
    o.routes.push_back({"POST", "/predict", false, [&](const http_request_view& r) { return predict(engine, config.model, r); },
                        true});
    server = std::make_unique<http_service>(board, std::move(o));
  }
  engine.start();
  const auto warm = clock_type::now() + std::chrono::seconds(3);
  std::this_thread::sleep_until(warm);
  const auto until = warm + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  w.rss_start = w.rss_max = rss_mib();
  std::thread client;
  if (server) {
    std::string body = "{\"features\": [";
    for (int i = 0; i < config.model.inputs(); ++i) body += (i ? ",0." : "0.") + std::to_string(i % 10);
    body += "]}";
    client = std::thread([&, body] { load(server->port(), rate, until, body, w, m, client_nice); });
  }
  while (clock_type::now() < until) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    w.rss_max = std::max(w.rss_max, rss_mib());
    if (w.rss_mid == 0 && clock_type::now() >= warm + (until - warm) / 2) w.rss_mid = rss_mib();
  }
  w.rss_end = rss_mib();
  if (client.joinable()) client.join();
  engine.stop();
  engine.wait();
  std::lock_guard lock(m);
  std::pair<clock_type::time_point, std::int64_t> first{}, last{};
  for (const auto& p : steps)
    if (p.first >= warm && p.first <= until) {
      if (first.second == 0) first = p;
      last = p;
    }
  const double dt = std::chrono::duration<double>(last.first - first.first).count();
  w.samples_per_s = dt > 0 ? static_cast<double>(last.second - first.second) * static_cast<double>(config.train.batch_size) / dt : 0;
  return w;
}

// The CPU time the load itself takes (server and client threads), with the
// engine stopped after its first parameter copy: what the load costs a
// machine that has no idle core.
void measure_load_cpu(const job_config& config, double seconds, double rate) {
  Engine engine(config);
  auto board = std::make_shared<metrics_board>();
  engine.on_event([&](const event& e) { board->on_event(e); });
  http_service_options o;
  o.routes.push_back({"POST", "/predict", false, [&](const http_request_view& r) { return predict(engine, config.model, r); },
                      true});
  http_service server(board, std::move(o));
  engine.start();
  while (!engine.latest_snapshot()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  engine.stop();
  engine.wait();
  std::string body = "{\"features\": [";
  for (int i = 0; i < config.model.inputs(); ++i) body += (i ? ",0." : "0.") + std::to_string(i % 10);
  body += "]}";
  window w;
  std::mutex m;
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  load(server.port(), rate, until, body, w, m, 0);
  ::getrusage(RUSAGE_SELF, &after);
  const auto cpu = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  };
  const double used = cpu(after) - cpu(before);
  const double system = static_cast<double>(after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                        1e-6 * static_cast<double>(after.ru_stime.tv_usec - before.ru_stime.tv_usec);
  std::printf("the load alone: %lld requests in %.0f s took %.3f s of CPU (%.1f%% of one core, %.1f us a request, "
              "server and client; %.0f%% of it in the kernel)\n",
              static_cast<long long>(w.requests), seconds, used, 100.0 * used / seconds,
              1e6 * used / static_cast<double>(std::max<std::int64_t>(1, w.requests)), 100.0 * system / used);
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_file = "configs/mlp.cfg";
  double seconds = 60, rate = 500;
  int rounds = 2;
  std::string cpus = "0";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--config") config_file = v;
    else if (a == "--seconds") seconds = std::stod(v);
    else if (a == "--rate") rate = std::stod(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--client-nice") client_nice = std::stoi(v);
    else if (a == "--server-nice") server_nice = std::stoi(v);
    else if (a == "--cpus") cpus = v;
  }
  const job_config config =
      load_job_config(config_file, {"train.epochs=100000", "train.checkpoint_dir=\"\"", "train.log_every=50",
                                    "optimizer.schedule=\"constant\"", "service.snapshot_every_s=0.5",
                                    "cluster.cpus=" + cpus});
  measure_load_cpu(config, std::min(seconds, 10.0), rate);
  std::vector<double> quiet, loaded, ratios;
  std::map<std::string, std::vector<double>> latency;
  std::int64_t requests = 0, errors = 0;
  for (int r = 0; r < rounds; ++r) {
    const window a = run_window(config, seconds, 0);
    const window b = run_window(config, seconds, rate);
    quiet.push_back(a.samples_per_s);
    loaded.push_back(b.samples_per_s);
    ratios.push_back(b.samples_per_s / a.samples_per_s);
    for (const auto& [path, v] : b.latency_ms) latency[path].insert(latency[path].end(), v.begin(), v.end());
    requests += b.requests;
    errors += b.errors;
    std::printf("round %d: unobserved %.0f samples/s, under load %.0f samples/s (%.1f%%); %lld requests, %lld errors; "
                "RSS %.1f, halfway %.1f, end %.1f, max %.1f MiB\n",
                r + 1, a.samples_per_s, b.samples_per_s, 100.0 * (b.samples_per_s / a.samples_per_s - 1.0),
                static_cast<long long>(b.requests), static_cast<long long>(b.errors), b.rss_start, b.rss_mid, b.rss_end,
                b.rss_max);
  }
  std::printf("\nmedian samples/s: unobserved %.0f, under %.0f requests/s %.0f; median of the rounds' ratios %.3f\n",
              median(quiet), rate, median(loaded), median(ratios));
  std::printf("requests %lld (%.0f/s), errors %lld\n", static_cast<long long>(requests),
              static_cast<double>(requests) / (seconds * rounds), static_cast<long long>(errors));
  for (const auto& [path, v] : latency)
    std::printf("%-9s p50 %.3f ms  p99 %.3f ms  max %.3f ms  (%zu)\n", path.c_str(), percentile(v, 0.5),
                percentile(v, 0.99), percentile(v, 1.0), v.size());
  return 0;
}
