#include "tensors/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dpactor {

std::optional<schedule_kind> parse_schedule(std::string_view name) noexcept {
  if (name == "constant") return schedule_kind::constant;
  if (name == "step") return schedule_kind::step;
  if (name == "cosine") return schedule_kind::cosine;
  return std::nullopt;
}

std::string_view schedule_name(schedule_kind kind) noexcept {
  switch (kind) {
    case schedule_kind::constant: return "constant";
    case schedule_kind::step: return "step";
    case schedule_kind::cosine: return "cosine";
  }
  return "?";
}

double lr_schedule::at(double t) const noexcept {
  const auto warmup = static_cast<double>(warmup_steps);
  if (t < warmup) return base_lr * (t + 1.0) / warmup;
  const double s = t - warmup;
  switch (kind) {
    case schedule_kind::constant: return base_lr;
    case schedule_kind::step:
      return base_lr * std::pow(gamma, std::floor(s / static_cast<double>(std::max<std::int64_t>(step_size, 1))));
    case schedule_kind::cosine: {
      const auto span = static_cast<double>(std::max<std::int64_t>(total_steps - warmup_steps, 1));
      const double progress = std::min(1.0, s / span);
      return min_lr + (base_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    }
  }
  return base_lr;
}

}  // namespace dpactor
