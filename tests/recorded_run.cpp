#include "tests/recorded_run.hpp"

#include <mutex>

#include <gtest/gtest.h>

namespace dpactor::testing {

recorded_run run_recorded(job_config c, run_options o, std::shared_ptr<trained_evidence> trained,
                          std::function<void(const event&)> also) {
  recorded_run r;
  if (trained) r.trained = std::move(trained);
  std::mutex m;
  Engine engine(std::move(c), std::move(o));
  engine.on_event([&](const event& e) {
    r.trained->record(e);
    std::lock_guard lock(m);
    if (also) also(e);
    if (const auto* x = std::get_if<membership_event>(&e)) r.memberships.push_back(*x);
    if (const auto* x = std::get_if<epoch_event>(&e)) r.epochs.push_back(*x);
    if (const auto* x = std::get_if<recovery_event>(&e)) r.recoveries.push_back(*x);
    if (const auto* x = std::get_if<step_event>(&e)) r.steps.push_back(*x);
  });
  engine.start();
  r.summary = engine.wait();
  return r;
}

job_config faulty_job(int replicas, std::vector<std::string> faults, replica_kind kind) {
  job_config c = small_job(kind, replicas, 64, 1024);
  c.train.epochs = 3;
  c.train.verify_replicas = true;  // survivors and newcomers stay bitwise identical
  c.train.record_trained = true;   // the devices' own account of what they trained
  // Generous: on a loaded machine a step can stall past the default (1 s)
  // and make a fault generation the test did not ask for. The hang tests set
  // their own.
  c.cluster.hang_timeout_s = 30;
  c.faults.inject = std::move(faults);
  return c;
}

void expect_exactly_once(const recorded_run& r, std::int64_t epochs) {
  EXPECT_EQ(r.trained->check(1024, epochs), "");
}

}  // namespace dpactor::testing
