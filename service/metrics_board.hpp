#pragma once
// What a running job looks like from outside, gathered from the engine's
// events (dpactor/events.hpp) and rendered in Prometheus' text exposition
// format (version 0.0.4) for GET /metrics. No threads of its own: the event
// callback calls on_event(), a scrape calls prometheus_text(), from any
// threads.
//
// Naming follows Prometheus' conventions: a `dpactor_` prefix, base units
// (seconds, ratios), `_total` on counters, per-device series labelled
// `device`. A checkpoint's age is computed at scrape time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensors/json.hpp"
#include <dpactor/events.hpp>

namespace dpactor {

class metrics_board {
 public:
  using clock = std::chrono::steady_clock;

  void on_event(const event& e);
  // Whether the run trains: from its first generation (a membership event)
  // until set_running(false) at its end.
  void set_running(bool running);
  // Also asks `probe` whether the run is still in progress (an adapter's
  // Engine::running), so that no one has to call set_running(false).
  void set_running_probe(std::function<bool()> probe);
  bool running() const;
  std::string prometheus_text(clock::time_point now = clock::now()) const;
  // The same state as one JSON object, for GET /status: running, step,
  // epochs, loss, accuracy, samples_per_s, lr, test_loss and test_accuracy
  // (null before the first epoch's end), generation, members (name, share,
  // samples_per_s each), workers (sync.mode = "async": each logical worker's
  // contributed, dropped, mean_staleness, inner_steps, samples_per_s; else
  // empty), cuts, faults, recoveries, checkpoint (step and
  // age_s, or null).
  json status(clock::time_point now = clock::now()) const;
  // Whether `name` is a member of the current generation.
  bool has_member(const std::string& name) const;

 private:
  mutable std::mutex mutex_;
  bool running_ = false;
  std::function<bool()> probe_;
  bool running_locked() const { return running_ && (!probe_ || probe_()); }
  std::int64_t steps_ = 0;
  std::int64_t epochs_ = 0;
  double loss_ = 0.0, accuracy_ = 0.0, lr_ = 0.0, samples_per_s_ = 0.0;
  std::optional<double> test_loss_, test_accuracy_;
  std::int64_t generation_ = 0;
  std::vector<std::string> members_;
  std::vector<double> shares_, throughput_;
  std::int64_t cuts_ = 0, skipped_ = 0, membership_changes_ = 0, faults_ = 0, recoveries_ = 0;
  double last_recovery_s_ = 0.0;
  std::int64_t requeued_ = 0;
  std::int64_t bytes_sent_ = 0;
  std::int64_t samples_ = 0;  // trained in this run, as of the last step event
  std::vector<worker_account> workers_;  // sync.mode = "async": each logical worker's account
  std::optional<std::int64_t> checkpoint_step_;
  std::optional<std::int64_t> committed_sequence_;  // stream mode (See Note [Exactly-once offsets])
  clock::time_point checkpoint_at_{};
};

}  // namespace dpactor
