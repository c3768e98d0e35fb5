#pragma once
// Losses over a (rows, classes) block of model outputs with integer labels.
// They return per-sample *sums*: the replica divides by the global sample count
// after the all-reduce, which makes N replicas on batch/N equal one replica on
// the whole batch (PyTorch's reduction='mean' over the global batch).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <dpactor/model_spec.hpp>

namespace dpactor {

std::optional<loss_kind> parse_loss(std::string_view name) noexcept;
std::string_view loss_name(loss_kind kind) noexcept;

struct loss_stats {
  double loss_sum = 0.0;     // sum over samples of each sample's loss
  std::int64_t correct = 0;  // samples whose arg-max output equals the label
};

// Softmax cross-entropy, stable (max subtracted). Per sample:
//   loss = log(sum_c exp(z_c)) - z_label,  dL/dz = softmax(z) - onehot(label).
// `grad` may be null (evaluation) or alias `logits`.
loss_stats softmax_cross_entropy(std::size_t rows, std::size_t classes, const float* logits,
                                 const std::int32_t* labels, float* grad) noexcept;

// Mean squared error against one-hot targets, PyTorch's MSELoss(reduction='mean')
// over (N, C): per sample loss = sum_c (y_c - t_c)^2 / C, dL/dy = 2 (y - t) / C.
loss_stats mse_one_hot(std::size_t rows, std::size_t classes, const float* outputs, const std::int32_t* labels,
                       float* grad) noexcept;

loss_stats compute_loss(loss_kind kind, std::size_t rows, std::size_t classes, const float* outputs,
                        const std::int32_t* labels, float* grad) noexcept;

// Samples whose arg-max (first maximum on ties) equals the label.
std::int64_t count_correct(std::size_t rows, std::size_t classes, const float* outputs,
                           const std::int32_t* labels) noexcept;

}  // namespace dpactor
