#pragma once
// A whole run on simulated members (See Note [Simulated members]): the
// engine's loader and reducer, its membership, hang detection, faults, joins
// and leaves, at hundreds or thousands of members, with a stand-in for each
// device. For tests and benchmarks of the control plane's scale
// (tests/simulated_members_test.cpp, bench/scale_bench.cpp); the engine
// itself never runs one.
//
// The reducer and the loader run on threads of their own (detached actors),
// so that the CPU time each spends is measured alone; the simulated members
// share one scheduler thread.

#include <chrono>
#include <cstdint>
#include <vector>

#include <dpactor/events.hpp>
#include "config/job_config.hpp"

namespace dpactor {

struct simulated_run_options {
  int members = 100;
  std::size_t train_rows = 100000;
  std::size_t test_rows = 1000;
  std::chrono::microseconds compute{0};   // each member's compute per step
  std::chrono::microseconds exchange{0};  // the collective, from the last arrival
  std::chrono::seconds timeout{600};      // the run's bound: past it, an error
};

struct simulated_run_result {
  run_summary summary;
  // CPU time of the reducer's and the loader's threads over the run (the
  // reducer's includes its hang check every 20 ms).
  double reducer_cpu_s = 0.0;
  double loader_cpu_s = 0.0;
  double wall_s = 0.0;
};

// Runs `config`'s job (train.*, cluster.min_devices and the hang timeouts,
// straggler.*, faults.inject) on `options.members` simulated members named
// "sim:<id>"; joins add more. The config must write no checkpoints, train in
// train.mode = "epochs" and sync.mode = "every_step", and inject only the
// faults fail, hang, slow, join and leave (config_error otherwise). Throws
// what the run fails with, and dpactor::error (timeout) past options.timeout.
simulated_run_result run_simulated(const job_config& config, const simulated_run_options& options,
                                   std::vector<event_callback> callbacks = {});

}  // namespace dpactor
