#pragma once
// Optimizers over flat buffers, with PyTorch's update formulas (torch.optim.SGD
// and torch.optim.AdamW, single-tensor path). Gradients arrive as sums over the
// global batch; `grad_scale` (1 / global samples) turns them into means inside
// the same pass.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <dpactor/optimizer_config.hpp>

namespace dpactor {

std::optional<optimizer_kind> parse_optimizer(std::string_view name) noexcept;
std::string_view optimizer_name(optimizer_kind kind) noexcept;

// Names of the per-parameter state tensors, as in PyTorch's optimizer
// state_dict: "momentum_buffer" for SGD with momentum, "exp_avg" and
// "exp_avg_sq" for AdamW; then "pending" for a delayed SGD (sync.delay's
// outer step).
std::vector<std::string> optimizer_slot_names(const optimizer_config& cfg);

// One optimizer step. `slots` holds one span per slot name, each as long as
// `params`. `step` is the number of steps taken before this one (0 for the
// first). With `grads` the element i of the gradient is grads[i] * grad_scale.
void optimizer_step(const optimizer_config& cfg, std::span<float> params, std::span<const float> grads,
                    std::span<const std::span<float>> slots, float grad_scale, double lr, std::int64_t step) noexcept;

// The same step out of place: reads params_in and slots_in, writes params_out
// and slots_out (each pair may alias; element i is read before it is written).
// With cfg.delayed (SGD only, See Note [Delayed rounds]) the step applies the
// update the previous step brought, kept in the last slot ("pending"), and
// keeps this one's; `flush`: applies both, and keeps nothing.
void optimizer_step(const optimizer_config& cfg, std::span<const float> params_in, std::span<float> params_out,
                    std::span<const float> grads, std::span<const std::span<const float>> slots_in,
                    std::span<const std::span<float>> slots_out, float grad_scale, double lr, std::int64_t step,
                    bool flush = false) noexcept;

}  // namespace dpactor
