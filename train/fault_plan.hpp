#pragma once
// Fault injection, deterministic by step (docs/faults.md). Specs come from
// `--inject SPEC`, `[faults] inject = [...]` and Engine::inject():
//   fail:R@S        device R throws during step S
//   hang:R@S        device R blocks in step S until its generation is aborted
//   slow:R:F[@S]    from step S (default 1), device R's compute takes F times as long
//   jitter:R:P:MS   each step, with probability P (seeded), device R takes MS ms longer
//   leave:R@S       device R leaves gracefully before step S
//   join:cpu@S      a new CPU device joins before step S
//   perturb:R@S     device R's state is corrupted (a bit flips) before step S:
//                   for tests of train.verify_replicas
//   nan:R@S         device R's gradients of step S hold a NaN: for tests of
//                   train.on_nonfinite
//   stuck:R@S       device R's thread blocks in step S for good, deaf to
//                   aborts (a driver or kernel hang): for tests of bounded
//                   shutdown
//   kill:R@S        device R's process kills itself (SIGKILL) right after
//                   step S's exchange, before it reports the step: a worker
//                   process's devices only, for tests of what a killed
//                   worker leaves behind
//   crash:loader@S  the loader throws as it issues step S, crash:reducer@S the
//                   reducer as it commits step S: for tests that an exception
//                   in any actor ends the run
// R is a device number (cpu:R), stable across generations; S counts optimizer
// steps from 1, as step records do.

#include <cstdint>
#include <string>
#include <vector>

namespace dpactor {

enum class fault_kind { fail, hang, slow, jitter, leave, join, perturb, nan, stuck, kill, crash };

// What crash:A@S brings down.
enum class crash_target { loader, reducer };

struct fault_spec {
  fault_kind kind = fault_kind::fail;
  int device = 0;           // -1 for join
  std::int64_t step = 1;    // 1-based step number
  double factor = 1.0;      // slow
  double probability = 0.0; // jitter
  double delay_ms = 0.0;    // jitter
  crash_target target = crash_target::loader;  // crash
  std::string text;         // as written, for messages
};

// Throws config_error naming the spec and what is wrong with it.
fault_spec parse_fault_spec(const std::string& text);
std::vector<fault_spec> parse_fault_specs(const std::vector<std::string>& texts);

// Faults that act inside a device's steps (fail, hang, slow, jitter, perturb, nan, stuck, kill).
bool is_device_fault(const fault_spec& f) noexcept;

}  // namespace dpactor
