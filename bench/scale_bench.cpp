// The control plane's cost against the member count (issue 35), on
// simulated members (Note [Simulated members]): the reducer's and the
// loader's CPU time per step, the wall time per step, and what a membership
// change (a failure, a join) costs, at 100, 1,000 and 4,000 members.
//
//   build/bin/scale_bench [--members 100,1000,4000] [--steps 60] [--repeats 3]
//                         [--compute-us 1000] [--exchange-us 500] [--fail-every K]
//
// --fail-every K: only the storm case, a member failing every K steps of
// the run (a different one each time), in both modes.
//
// Each member trains 2 samples a step (the global batch is 2 x members; in
// reproducible mode one slice each), so the data a step hands out grows
// with the members, as it would with a fixed per-device batch. Prints one
// line per case with medians over the repeats.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "actors/simulated_run.hpp"

namespace {

using namespace dpactor;
using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct measured {
  double reducer_ms_per_step = 0, loader_ms_per_step = 0, wall_ms_per_step = 0;
  double step_gap_ms = 0;    // median time between two step commits
  double change_gap_ms = 0;  // median time between the last commit before a change and the first after
  double recovery_ms = 0;    // median recovery_event (failures only)
  std::int64_t samples = 0, expected = 0;
};

measured run_case(int members, std::int64_t steps, bool reproducible, const std::vector<std::string>& faults,
                  std::chrono::microseconds compute, std::chrono::microseconds exchange) {
  job_config c;
  c.source = "scale_bench";
  c.train.batch_size = 2 * members;
  c.train.micro_batch = 2;
  c.train.epochs = 1;
  c.train.reproducible = reproducible;
  c.train.log_every = 1;
  c.train.checkpoint_dir = "";
  c.straggler.policy = straggler_policy::none;
  c.cluster.min_devices = 1;
  c.faults.inject = faults;
  simulated_run_options o;
  o.members = members;
  o.train_rows = static_cast<std::size_t>(2 * members * steps);
  o.compute = compute;
  o.exchange = exchange;

  std::mutex m;
  std::vector<std::pair<std::int64_t, clock_type::time_point>> commits;  // (generation, when)
  std::vector<double> recoveries;
  const simulated_run_result r = run_simulated(c, o, {[&](const event& e) {
                                                 std::lock_guard lock(m);
                                                 if (const auto* s = std::get_if<step_event>(&e))
                                                   commits.emplace_back(s->generation, clock_type::now());
                                                 if (const auto* x = std::get_if<recovery_event>(&e))
                                                   recoveries.push_back(x->recovery_ms);
                                               }});
  measured out;
  const auto done = static_cast<double>(r.summary.steps);
  out.reducer_ms_per_step = 1e3 * r.reducer_cpu_s / done;
  out.loader_ms_per_step = 1e3 * r.loader_cpu_s / done;
  out.wall_ms_per_step = 1e3 * r.summary.train_s / done;
  std::vector<double> gaps, changes;
  for (std::size_t i = 1; i < commits.size(); ++i) {
    const double ms = std::chrono::duration<double, std::milli>(commits[i].second - commits[i - 1].second).count();
    (commits[i].first == commits[i - 1].first ? gaps : changes).push_back(ms);
  }
  out.step_gap_ms = median(gaps);
  out.change_gap_ms = median(changes);
  out.recovery_ms = median(recoveries);
  out.samples = r.summary.samples;
  out.expected = static_cast<std::int64_t>(o.train_rows);
  return out;
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> member_counts{100, 1000, 4000};
  std::int64_t steps = 60;
  int repeats = 3;
  long compute_us = 1000, exchange_us = 500;
  std::int64_t fail_every = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--members") member_counts = parse_list(argv[i + 1]);
    else if (flag == "--steps") steps = std::atoll(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (flag == "--compute-us") compute_us = std::atol(argv[i + 1]);
    else if (flag == "--exchange-us") exchange_us = std::atol(argv[i + 1]);
    else if (flag == "--fail-every") fail_every = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "scale_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const std::chrono::microseconds compute(compute_us), exchange(exchange_us);
  std::printf("# %lld steps a run, compute %ld us, exchange %ld us, medians of %d\n", static_cast<long long>(steps),
              compute_us, exchange_us, repeats);
  std::printf("%-12s %-8s %8s %12s %12s %12s %10s %12s %12s %s\n", "case", "mode", "members", "reducer_ms/st",
              "loader_ms/st", "wall_ms/st", "gap_ms", "change_ms", "recovery_ms", "samples");
  for (const int n : member_counts) {
    // Four failures, or four joins, spread over the run.
    std::vector<std::string> failures, joins, storm;
    for (int k = 1; k <= 4; ++k) {
      const std::int64_t at = k * steps / 5;
      failures.push_back("fail:" + std::to_string((k * n) / 5) + "@" + std::to_string(at));
      joins.push_back("join:cpu@" + std::to_string(at));
    }
    for (std::int64_t at = fail_every, k = 0; fail_every > 0 && at < steps; at += fail_every, ++k)
      storm.push_back("fail:" + std::to_string((k * 7919) % n) + "@" + std::to_string(at));
    std::vector<std::pair<std::string, std::vector<std::string>>> cases;
    if (fail_every > 0) {
      cases.emplace_back(std::to_string(storm.size()) + " failures", storm);
    } else {
      cases.emplace_back("quiet", std::vector<std::string>{});
      cases.emplace_back("4 failures", failures);
      cases.emplace_back("4 joins", joins);
    }
    for (const bool reproducible : {true, false}) {
      for (const auto& [name, faults] : cases) {
        std::vector<measured> runs;
        for (int rep = 0; rep < repeats; ++rep) runs.push_back(run_case(n, steps, reproducible, faults, compute, exchange));
        const auto med = [&](double measured::*field) {
          std::vector<double> v;
          for (const auto& m : runs) v.push_back(m.*field);
          return median(v);
        };
        bool all = true;
        for (const auto& m : runs) all = all && m.samples == m.expected;
        std::printf("%-12s %-8s %8d %12.3f %12.3f %12.3f %10.2f %12.2f %12.2f %s\n", name.c_str(),
                    reproducible ? "reprod" : "fast", n, med(&measured::reducer_ms_per_step),
                    med(&measured::loader_ms_per_step), med(&measured::wall_ms_per_step), med(&measured::step_gap_ms),
                    med(&measured::change_gap_ms), med(&measured::recovery_ms), all ? "all once" : "MISMATCH");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
