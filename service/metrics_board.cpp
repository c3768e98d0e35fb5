#include "service/metrics_board.hpp"

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <type_traits>

namespace dpactor {
namespace {

// A label value as the text format wants it: backslash, quote and newline escaped.
std::string escaped(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// One metric family: its HELP and TYPE lines, then its samples.
class family {
 public:
  family(std::string& out, const char* name, const char* type, const char* help) : out_(out), name_(name) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(double v) { out_ += name_ + " " + number(v) + "\n"; }
  void sample(const std::string& device, double v) { sample("device", device, v); }
  void sample(const char* label, const std::string& value, double v) {
    out_ += name_ + "{" + label + "=\"" + escaped(value) + "\"} " + number(v) + "\n";
  }

 private:
  std::string& out_;
  std::string name_;
};

// Membership changes whose reason is a fault, not a start, join or leave.
bool is_fault(const std::string& reason) {
  return reason != "start" && reason.find(" joined") == std::string::npos && reason.find(" left") == std::string::npos;
}

}  // namespace

void metrics_board::on_event(const event& e) {
  std::lock_guard lock(mutex_);
  std::visit(
      [this](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, step_event>) {
          steps_ = x.step;
          loss_ = x.loss;
          accuracy_ = x.accuracy;
          lr_ = x.lr;
          samples_per_s_ = x.samples_per_s;
          generation_ = x.generation;
          cuts_ += x.cuts;
          skipped_ += x.skipped;
          shares_ = x.shares;
          throughput_ = x.throughput;
          bytes_sent_ = x.bytes_sent;
          samples_ = x.samples;
          if (!x.workers.empty()) workers_ = x.workers;
        } else if constexpr (std::is_same_v<T, epoch_event>) {
          epochs_ = x.epoch + 1;
          test_loss_ = x.test_loss;
          test_accuracy_ = x.test_accuracy;
          requeued_ += x.requeued;
        } else if constexpr (std::is_same_v<T, membership_event>) {
          running_ = true;  // a generation trains
          generation_ = x.generation;
          members_ = x.members;
          shares_.clear();
          throughput_.clear();
          if (x.generation > 0) ++membership_changes_;
          if (x.generation > 0 && is_fault(x.reason)) ++faults_;
        } else if constexpr (std::is_same_v<T, recovery_event>) {
          ++recoveries_;
          last_recovery_s_ = x.recovery_ms / 1000.0;
        } else if constexpr (std::is_same_v<T, checkpoint_event>) {
          checkpoint_step_ = x.step;
          checkpoint_at_ = clock::now();
          if (x.committed_sequence >= 0) committed_sequence_ = x.committed_sequence;
        }
      },
      e);
}

void metrics_board::set_running(bool running) {
  std::lock_guard lock(mutex_);
  running_ = running;
}

void metrics_board::set_running_probe(std::function<bool()> probe) {
  std::lock_guard lock(mutex_);
  probe_ = std::move(probe);
}

bool metrics_board::running() const {
  std::lock_guard lock(mutex_);
  return running_locked();
}

json metrics_board::status(clock::time_point now) const {
  std::lock_guard lock(mutex_);
  json members = json::array();
  for (std::size_t r = 0; r < members_.size(); ++r) {
    json m{{"name", members_[r]}};
    m["share"] = r < shares_.size() ? json(shares_[r]) : json(nullptr);
    m["samples_per_s"] = r < throughput_.size() ? json(throughput_[r]) : json(nullptr);
    members.push_back(std::move(m));
  }
  json workers = json::array();
  for (const worker_account& w : workers_)
    workers.push_back({{"contributed", w.contributed}, {"dropped", w.dropped}, {"mean_staleness", w.mean_staleness},
                       {"inner_steps", w.inner_steps}, {"samples_per_s", w.samples_per_s}});
  json checkpoint = nullptr;
  if (checkpoint_step_)
    checkpoint = json{{"step", *checkpoint_step_},
                      {"age_s", std::chrono::duration<double>(now - checkpoint_at_).count()},
                      {"committed_sequence", committed_sequence_ ? json(*committed_sequence_) : json(nullptr)}};
  return json{{"running", running_locked()},
              {"step", steps_},
              {"samples", samples_},
              {"epochs", epochs_},
              {"loss", loss_},
              {"accuracy", accuracy_},
              {"samples_per_s", samples_per_s_},
              {"lr", lr_},
              {"test_loss", test_loss_ ? json(*test_loss_) : json(nullptr)},
              {"test_accuracy", test_accuracy_ ? json(*test_accuracy_) : json(nullptr)},
              {"generation", generation_},
              {"members", std::move(members)},
              {"workers", std::move(workers)},
              {"cuts", cuts_},
              {"faults", faults_},
              {"recoveries", recoveries_},
              {"checkpoint", std::move(checkpoint)}};
}

std::string metrics_board::prometheus_text(clock::time_point now) const {
  std::lock_guard lock(mutex_);
  std::string out;
  family(out, "dpactor_running", "gauge", "1 while the run trains.").sample(running_locked() ? 1 : 0);
  family(out, "dpactor_steps_total", "counter", "Optimizer steps done.").sample(static_cast<double>(steps_));
  family(out, "dpactor_epochs_total", "counter", "Epochs completed.").sample(static_cast<double>(epochs_));
  family(out, "dpactor_train_samples_total", "counter", "Samples trained in this run.")
      .sample(static_cast<double>(samples_));
  family(out, "dpactor_train_samples_per_second", "gauge", "Training throughput over the last logging window.")
      .sample(samples_per_s_);
  family(out, "dpactor_train_loss", "gauge", "Mean training loss over the last logging window.").sample(loss_);
  family(out, "dpactor_train_accuracy_ratio", "gauge", "Training accuracy over the last logging window.")
      .sample(accuracy_);
  if (test_loss_) family(out, "dpactor_test_loss", "gauge", "Test loss at the last epoch's end.").sample(*test_loss_);
  if (test_accuracy_)
    family(out, "dpactor_test_accuracy_ratio", "gauge", "Test accuracy at the last epoch's end.").sample(*test_accuracy_);
  family(out, "dpactor_learning_rate", "gauge", "Learning rate of the last step.").sample(lr_);
  family(out, "dpactor_generation", "gauge", "Current generation (membership epoch).").sample(static_cast<double>(generation_));
  family(out, "dpactor_members", "gauge", "Devices in the current generation.").sample(static_cast<double>(members_.size()));
  if (shares_.size() == members_.size() && !members_.empty()) {
    family share(out, "dpactor_device_share_ratio", "gauge", "Each device's share of the global batch.");
    for (std::size_t r = 0; r < members_.size(); ++r) share.sample(members_[r], shares_[r]);
  }
  if (throughput_.size() == members_.size() && !members_.empty()) {
    family speed(out, "dpactor_device_samples_per_second", "gauge", "Each device's smoothed throughput.");
    for (std::size_t r = 0; r < members_.size(); ++r) speed.sample(members_[r], throughput_[r]);
  }
  family(out, "dpactor_cuts_total", "counter", "Devices cut short at their step deadline.").sample(static_cast<double>(cuts_));
  family(out, "dpactor_skipped_steps_total", "counter", "Steps not applied for non-finite values.")
      .sample(static_cast<double>(skipped_));
  family(out, "dpactor_membership_changes_total", "counter", "Generations started after the first.")
      .sample(static_cast<double>(membership_changes_));
  family(out, "dpactor_faults_total", "counter", "Membership changes caused by a failed, hung or lost device.")
      .sample(static_cast<double>(faults_));
  family(out, "dpactor_recoveries_total", "counter", "Steps committed after a fault.").sample(static_cast<double>(recoveries_));
  family(out, "dpactor_last_recovery_seconds", "gauge", "From the last fault's detection to the next committed step.")
      .sample(last_recovery_s_);
  family(out, "dpactor_bytes_sent_total", "counter",
         "Bytes the devices' collectives sent, as of the last step event (docs/async.md, \"Bytes sent\").")
      .sample(static_cast<double>(bytes_sent_));
  family(out, "dpactor_requeued_samples_total", "counter", "Sample indices handed out again (cuts and faults), by epoch ends.")
      .sample(static_cast<double>(requeued_));
  if (!workers_.empty()) {  // sync.mode = "async" (docs/async.md)
    const auto per_worker = [&](const char* name, const char* type, const char* help, auto value) {
      family f(out, name, type, help);
      for (std::size_t k = 0; k < workers_.size(); ++k) f.sample("worker", std::to_string(k), value(workers_[k]));
    };
    per_worker("dpactor_worker_contributions_total", "counter", "Async: each logical worker's contributions merged into committed rounds.",
               [](const worker_account& w) { return static_cast<double>(w.contributed); });
    per_worker("dpactor_worker_dropped_total", "counter", "Async: each logical worker's contributions dropped as stale.",
               [](const worker_account& w) { return static_cast<double>(w.dropped); });
    per_worker("dpactor_worker_mean_staleness_rounds", "gauge", "Async: each logical worker's mean staleness over its merged contributions.",
               [](const worker_account& w) { return w.mean_staleness; });
    per_worker("dpactor_worker_inner_steps", "gauge", "Async: each logical worker's inner steps in its last round (H_k).",
               [](const worker_account& w) { return static_cast<double>(w.inner_steps); });
  }
  if (checkpoint_step_) {
    family(out, "dpactor_checkpoint_step", "gauge", "Step of the last checkpoint written.")
        .sample(static_cast<double>(*checkpoint_step_));
    family(out, "dpactor_checkpoint_age_seconds", "gauge", "Time since the last checkpoint was written.")
        .sample(std::chrono::duration<double>(now - checkpoint_at_).count());
  }
  if (committed_sequence_) {
    family(out, "dpactor_committed_sequence", "gauge",
           "Stream mode: every record fed up to this sequence number is trained and inside a checkpoint.")
        .sample(static_cast<double>(*committed_sequence_));
  }
  return out;
}

bool metrics_board::has_member(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return std::find(members_.begin(), members_.end(), name) != members_.end();
}

}  // namespace dpactor
