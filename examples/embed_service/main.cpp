// A service that learns continuously from a record stream and serves
// predictions while it trains, with exactly-once offsets (docs/service.md).
//
//   embed_service CONFIG --state DIR [--source drift|FILE|-] [--records N] [--rate R]
//
// Records come from a generator whose classes drift over time ("drift", the
// default), or from CSV lines "label,feature,..." in a file or on stdin
// (the record's sequence number is its line number). The engine trains in
// stream mode; after each checkpoint the service commits its upstream
// offset to DIR/offset, as it would to Kafka. Killed (even with kill -9)
// and restarted with the same arguments, it resumes from DIR/checkpoints and
// the source replays from the committed offset: nothing is lost, and what
// the checkpoint already holds is skipped, so nothing is trained twice.
// HTTP (service.listen): POST /predict {"features": [...]} from the latest
// parameters, GET /metrics, /status, and with DPACTOR_SERVICE_TOKEN set the
// control endpoints.

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include <dpactor/engine.hpp>
#include <dpactor/http.hpp>

namespace fs = std::filesystem;
using namespace dpactor;

namespace {

std::atomic<bool> interrupted{false};

// Classes are Gaussian blobs whose centres rotate slowly with the sequence
// number: what was learned goes stale unless training goes on.
class drift_source : public record_source {
 public:
  drift_source(int features, int classes, std::int64_t end, double rate) : f_(features), c_(classes), end_(end), rate_(rate) {}
  void seek(std::int64_t committed) override { next_ = committed + 1; }
  bool pull(std::vector<record>& out, std::size_t max) override {
    if (rate_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(static_cast<double>(max) / rate_));
    for (std::size_t i = 0; i < max && (end_ == 0 || next_ < end_); ++i, ++next_) out.push_back(at(next_));
    return end_ == 0 || next_ < end_;
  }
  record at(std::int64_t s) const {
    std::mt19937_64 rng(static_cast<std::uint64_t>(s) * 0x9e3779b97f4a7c15ULL);  // a function of s: replays agree
    std::normal_distribution<float> noise(0.0f, 0.6f);
    record r{s, static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c_)), std::vector<float>(f_)};
    const double angle = static_cast<double>(s) * 1e-5;  // a full turn every ~630,000 records
    for (int k = 0; k < f_; ++k)
      r.features[k] = noise(rng) + static_cast<float>(std::cos(angle + 2.0 * M_PI * ((r.label * 7 + k) % c_) / c_));
    return r;
  }

 private:
  int f_, c_;
  std::int64_t end_, next_ = 0;
  double rate_;
};

// CSV lines "label,feature,...", the sequence number being the line number.
class csv_source : public record_source {
 public:
  csv_source(std::istream& in, std::int64_t end) : in_(in), end_(end) {}
  void seek(std::int64_t committed) override { skip_ = committed + 1; }
  bool pull(std::vector<record>& out, std::size_t max) override {
    std::string line;
    while (out.size() < max && (end_ == 0 || line_ < end_) && std::getline(in_, line)) {
      const std::int64_t s = line_++;
      if (s < skip_ || line.empty()) continue;
      record r{s, 0, {}};
      std::istringstream fields(line);
      std::string v;
      for (bool first = true; std::getline(fields, v, ','); first = false) {
        if (first) r.label = std::stoi(v);
        else r.features.push_back(std::stof(v));
      }
      out.push_back(std::move(r));
    }
    return in_.good() && (end_ == 0 || line_ < end_);
  }

 private:
  std::istream& in_;
  std::int64_t end_, line_ = 0, skip_ = 0;
};

// The upstream offset: the next record to read, written atomically.
void commit_offset(const fs::path& file, std::int64_t next) {
  const fs::path tmp = file.string() + ".tmp";
  std::ofstream(tmp) << next << "\n" << std::flush;
  fs::rename(tmp, file);
}

std::int64_t read_offset(const fs::path& file) {
  std::ifstream in(file);
  std::int64_t next = 0;
  return in >> next ? next : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string config_file, state, source = "drift";
  std::int64_t records = 0;
  double rate = 20000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i], v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--state") state = v, ++i;
    else if (a == "--source") source = v, ++i;
    else if (a == "--records") records = std::stoll(v), ++i;
    else if (a == "--rate") rate = std::stod(v), ++i;
    else config_file = a;
  }
  if (config_file.empty() || state.empty()) {
    std::fprintf(stderr, "usage: %s CONFIG --state DIR [--source drift|FILE|-] [--records N] [--rate R]\n", argv[0]);
    return 2;
  }
  try {
    fs::create_directories(state);
    const fs::path checkpoints = fs::path(state) / "checkpoints", offset_file = fs::path(state) / "offset";
    job_config config = load_job_config(config_file, {"train.checkpoint_dir=\"" + checkpoints.string() + "\""});
    run_options options;
    if (fs::exists(checkpoints / "latest")) options.resume_from = checkpoints.string();
    // The upstream replays from its committed offset, which may lag the
    // checkpoint (a crash between the two): the engine skips the overlap.
    const std::int64_t offset = read_offset(offset_file);
    std::ifstream file;
    std::shared_ptr<record_source> src;
    if (source == "drift") src = std::make_shared<drift_source>(config.model.inputs(), config.model.outputs(), records, rate);
    else if (source == "-") src = std::make_shared<csv_source>(std::cin, records);
    else if (file.open(source); file) src = std::make_shared<csv_source>(file, records);
    else throw std::runtime_error("cannot read " + source);
    struct offset_source : record_source {  // seeks the upstream to its own offset, not the engine's
      std::shared_ptr<record_source> inner;
      std::int64_t offset;
      void seek(std::int64_t) override { inner->seek(offset - 1); }
      bool pull(std::vector<record>& out, std::size_t max) override { return inner->pull(out, max); }
    };
    auto upstream = std::make_shared<offset_source>();
    upstream->inner = src;
    upstream->offset = offset;
    options.records = upstream;

    Engine engine(config, options);
    engine.on_event([&](const event& e) {
      if (const auto* c = std::get_if<checkpoint_event>(&e); c && c->committed_sequence >= 0)
        commit_offset(offset_file, c->committed_sequence + 1);  // only after the checkpoint holds it
      if (const auto* s = std::get_if<step_event>(&e))
        std::printf("step %lld: loss %.4f, accuracy %.3f, %.0f samples/s\n", static_cast<long long>(s->step), s->loss,
                    s->accuracy, s->samples_per_s);
    });
    // The run over HTTP (service.listen): the dashboard, /metrics, /status,
    // /events, POST /predict, and the control routes with a token.
    std::unique_ptr<http_face> http;
    if (!config.service.listen.empty()) {
      http = std::make_unique<http_face>(engine);
      std::printf("serving on http://%s:%u (dashboard at /, POST /predict, GET /metrics, /status, /events)\n",
                  http->address().c_str(), http->port());
    }
    std::signal(SIGINT, [](int) { interrupted = true; });
    std::signal(SIGTERM, [](int) { interrupted = true; });
    engine.start();
    std::printf("replaying from record %lld (the checkpoint holds up to %lld)\n", static_cast<long long>(offset),
                static_cast<long long>(engine.committed_sequence()));
    std::thread watcher([&] {
      while (!interrupted && engine.running()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (interrupted) engine.stop();
    });
    const run_summary summary = engine.wait();
    interrupted = true;
    watcher.join();
    std::printf("stopped after %lld steps; every record up to %lld is trained and committed\n",
                static_cast<long long>(summary.steps), static_cast<long long>(engine.committed_sequence()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed_service: %s\n", e.what());
    return 1;
  }
}
