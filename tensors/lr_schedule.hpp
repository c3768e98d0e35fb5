#pragma once
// Learning-rate schedules as a pure function of the optimizer step, so every
// replica, and a resumed run, computes the same rate without shared state.

#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>
#include <dpactor/optimizer_config.hpp>

namespace dpactor {

std::optional<schedule_kind> parse_schedule(std::string_view name) noexcept;
std::string_view schedule_name(schedule_kind kind) noexcept;

struct lr_schedule {
  schedule_kind kind = schedule_kind::constant;
  double base_lr = 0.1;
  std::int64_t warmup_steps = 0;  // linear warmup from base_lr / warmup_steps
  std::int64_t step_size = 1;     // step: decay every step_size steps ...
  double gamma = 0.1;             // ... by this factor
  std::int64_t total_steps = 0;   // cosine: steps from the end of warmup to min_lr
  double min_lr = 0.0;            // cosine: final rate

  // Rate at schedule position t: the optimizer step's index (0 for the first
  // step), or a fraction between two when cuts made steps smaller (See Note
  // [Schedule position]). At whole t both forms give the same bits.
  //   warmup:   base * (t + 1) / warmup_steps            for t < warmup_steps
  //   constant: base
  //   step:     base * gamma^floor(s / step_size)        (StepLR)
  //   cosine:   min + (base - min) (1 + cos(pi s / T)) / 2 (CosineAnnealingLR), s <= T
  // with s = t - warmup_steps and T = total_steps - warmup_steps.
  double at(double t) const noexcept;
  template <std::integral Step>
  double at(Step t) const noexcept {
    return at(static_cast<double>(t));
  }
};

}  // namespace dpactor
