// A service in miniature for the stream tests: trains in stream mode, feeds
// records [from, --records) at a steady rate, and logs what the engine
// reports, one JSON line per event, to --log (appended, each line one
// write(2), so that a kill -9 leaves whole lines behind):
//   {"start": true, "resumed_step": S, "committed": C}
//   {"trained": STEP, "samples": N, "digest": D}   (per device and step)
//   {"checkpoint": STEP, "committed": C}
//   {"end": true, "steps": S, "committed": C}
// With --resume it resumes from --checkpoints and replays from `--replay`
// records before the committed offset, which the engine must skip.
//
//   stream_feeder --checkpoints DIR --log FILE --records N --rate R [--resume] [--replay K] [--cpus N]

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <dpactor/engine.hpp>
#include "stream_records.hpp"
#include "tensors/json.hpp"

using namespace dpactor;

namespace {

int log_fd = -1;

void log_line(const json& j) {
  const std::string line = j.dump() + "\n";
  if (::write(log_fd, line.data(), line.size()) < 0) std::perror("write");
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoints, log_path;
  std::int64_t total = 0, replay = 0, cpus = 2;
  double rate = 1000.0;
  bool resume = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--checkpoints") checkpoints = next();
    else if (a == "--log") log_path = next();
    else if (a == "--records") total = std::stoll(next());
    else if (a == "--rate") rate = std::stod(next());
    else if (a == "--replay") replay = std::stoll(next());
    else if (a == "--cpus") cpus = std::stoll(next());
    else if (a == "--resume") resume = true;
    else {
      std::fprintf(stderr, "stream_feeder: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log_fd < 0) return 2;

  job_config c;
  c.source = "stream_feeder";
  c.model = mlp_spec{{testing::stream_features, 32, testing::stream_classes}, activation::relu, loss_kind::cross_entropy};
  c.optimizer.kind = optimizer_kind::sgd;
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.schedule.kind = schedule_kind::constant;
  c.train.mode = train_mode::stream;
  c.train.batch_size = 32;
  c.train.micro_batch = 8;
  c.train.checkpoint_dir = checkpoints;
  c.train.checkpoint_every_s = 0.2;
  c.train.keep_checkpoints = 0;
  c.train.record_trained = true;
  c.train.log_every = 1000;
  c.train.stream_queue = 256;
  c.cluster.cpus = cpus;
  c.cluster.blas_threads = 1;
  c.straggler.policy = straggler_policy::none;

  run_options options;
  if (resume) options.resume_from = checkpoints;
  Engine engine(c, options);
  engine.on_event([](const event& e) {
    if (const auto* t = std::get_if<trained_event>(&e))
      log_line({{"trained", t->step}, {"samples", t->samples}, {"digest", t->digest}});
    else if (const auto* k = std::get_if<checkpoint_event>(&e))
      log_line({{"checkpoint", k->step}, {"committed", k->committed_sequence}});
  });
  engine.start();
  const std::int64_t committed = engine.committed_sequence();
  log_line({{"start", true}, {"committed", committed}});
  // Records at a steady rate, in bursts.
  const std::int64_t from = std::max<std::int64_t>(0, committed + 1 - replay);
  constexpr std::int64_t chunk = 160;  // bursts of 5 steps: steps are in flight when a checkpoint is taken
  const auto begin = std::chrono::steady_clock::now();
  for (std::int64_t s = from; s < total; s += chunk) {
    const auto records = testing::stream_records(s, std::min(total, s + chunk));
    std::span<const record> rest(records);
    while (!rest.empty()) {
      const feed_result r = engine.feed(rest, std::chrono::seconds(1));
      if (r.status == feed_result::outcome::closed) {
        std::fprintf(stderr, "stream_feeder: the stream closed at %lld\n", static_cast<long long>(rest.front().sequence));
        return 1;
      }
      rest = rest.subspan(r.taken);
    }
    const auto due = begin + std::chrono::duration<double>(static_cast<double>(s + chunk - from) / rate);
    std::this_thread::sleep_until(due);
  }
  engine.end_stream();
  const run_summary summary = engine.wait();
  log_line({{"end", true}, {"steps", summary.steps}, {"committed", engine.committed_sequence()}});
  std::printf("stream_feeder: %lld steps, committed %lld\n", static_cast<long long>(summary.steps),
              static_cast<long long>(engine.committed_sequence()));
  return 0;
}
