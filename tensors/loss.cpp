#include "tensors/loss.hpp"

#include <cmath>

namespace dpactor {
namespace {

std::size_t arg_max(const float* row, std::size_t n) noexcept {
  std::size_t best = 0;
  for (std::size_t c = 1; c < n; ++c)
    if (row[c] > row[best]) best = c;
  return best;
}

}  // namespace

std::optional<loss_kind> parse_loss(std::string_view name) noexcept {
  if (name == "cross_entropy") return loss_kind::cross_entropy;
  if (name == "mse") return loss_kind::mse;
  return std::nullopt;
}

std::string_view loss_name(loss_kind kind) noexcept {
  return kind == loss_kind::cross_entropy ? "cross_entropy" : "mse";
}

loss_stats softmax_cross_entropy(std::size_t rows, std::size_t classes, const float* logits,
                                 const std::int32_t* labels, float* grad) noexcept {
  loss_stats stats;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    const std::size_t best = arg_max(z, classes);
    const float max = z[best];
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - max));
    const auto label = static_cast<std::size_t>(labels[r]);
    stats.loss_sum += std::log(sum) - static_cast<double>(z[label] - max);
    stats.correct += best == label ? 1 : 0;
    if (grad != nullptr) {
      float* g = grad + r * classes;
      const float inv_sum = static_cast<float>(1.0 / sum);
      for (std::size_t c = 0; c < classes; ++c) g[c] = std::exp(z[c] - max) * inv_sum;
      g[label] -= 1.0f;
    }
  }
  return stats;
}

loss_stats mse_one_hot(std::size_t rows, std::size_t classes, const float* outputs, const std::int32_t* labels,
                       float* grad) noexcept {
  loss_stats stats;
  const float scale = 2.0f / static_cast<float>(classes);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* y = outputs + r * classes;
    const auto label = static_cast<std::size_t>(labels[r]);
    stats.correct += arg_max(y, classes) == label ? 1 : 0;
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) {
      const float diff = y[c] - (c == label ? 1.0f : 0.0f);
      sum += static_cast<double>(diff) * diff;
      if (grad != nullptr) grad[r * classes + c] = scale * diff;
    }
    stats.loss_sum += sum / static_cast<double>(classes);
  }
  return stats;
}

loss_stats compute_loss(loss_kind kind, std::size_t rows, std::size_t classes, const float* outputs,
                        const std::int32_t* labels, float* grad) noexcept {
  return kind == loss_kind::cross_entropy ? softmax_cross_entropy(rows, classes, outputs, labels, grad)
                                          : mse_one_hot(rows, classes, outputs, labels, grad);
}

std::int64_t count_correct(std::size_t rows, std::size_t classes, const float* outputs,
                           const std::int32_t* labels) noexcept {
  std::int64_t correct = 0;
  for (std::size_t r = 0; r < rows; ++r)
    correct += arg_max(outputs + r * classes, classes) == static_cast<std::size_t>(labels[r]) ? 1 : 0;
  return correct;
}

}  // namespace dpactor
