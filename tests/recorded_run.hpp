#pragma once
// A run of the whole engine with what it said recorded, for the tests of
// faults, cuts and elasticity (fault_recovery_test, cut_recovery_test): the
// summary, the membership, epoch, recovery and step events, and what the
// devices say they trained (the independent evidence of exactly-once).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <dpactor/engine.hpp>
#include "tests/test_support.hpp"

namespace dpactor::testing {

struct recorded_run {
  run_summary summary;
  std::shared_ptr<trained_evidence> trained = std::make_shared<trained_evidence>();
  std::vector<membership_event> memberships;
  std::vector<epoch_event> epochs;
  std::vector<recovery_event> recoveries;
  std::vector<step_event> steps;
};

// Runs `c` to its end. `trained`: where the devices' account goes; shared
// by runs that continue each other. `also` sees every event too.
recorded_run run_recorded(job_config c, run_options o = {}, std::shared_ptr<trained_evidence> trained = nullptr,
                          std::function<void(const event&)> also = nullptr);

// small_job with 1024 samples at batch 64 (16 steps per epoch), 3 epochs,
// the faults `faults`, train.verify_replicas and train.record_trained on, and
// a generous hang timeout.
job_config faulty_job(int replicas, std::vector<std::string> faults, replica_kind kind = current_kind());

// Every epoch of `r` trained every sample exactly once, by the devices' account.
void expect_exactly_once(const recorded_run& r, std::int64_t epochs = 3);

}  // namespace dpactor::testing
