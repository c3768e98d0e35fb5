#include "tensors/optimizer.hpp"

#include "tensors/simd.hpp"

#include <cassert>
#include <cmath>

namespace dpactor {
namespace {

// torch.optim.SGD:
//   g = grad + wd * p
//   buf = g on the first step, else momentum * buf + (1 - dampening) * g
//   g = g + momentum * buf (nesterov) or buf
//   p = p - lr * g
DPACTOR_MULTIVERSION void sgd_step(const optimizer_config& cfg, std::span<float> p, std::span<const float> grads,
              std::span<const std::span<float>> slots, float scale, double lr, std::int64_t step) noexcept {
  const float wd = static_cast<float>(cfg.weight_decay);
  const float lr_f = static_cast<float>(lr);
  const std::size_t n = p.size();
  float* pp = p.data();
  const float* gp = grads.data();
  if (cfg.momentum == 0.0) {
    for (std::size_t i = 0; i < n; ++i) {
      const float g = gp[i] * scale + wd * pp[i];
      pp[i] -= lr_f * g;
    }
    return;
  }
  assert(slots.size() == 1);
  float* buf = slots[0].data();
  const float mom = static_cast<float>(cfg.momentum);
  const float keep = static_cast<float>(1.0 - cfg.dampening);
  const bool first = step == 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gp[i] * scale + wd * pp[i];
    const float b = first ? g : mom * buf[i] + keep * g;
    buf[i] = b;
    const float d = cfg.nesterov ? g + mom * b : b;
    pp[i] -= lr_f * d;
  }
}

// torch.optim.AdamW (amsgrad off), t = step + 1:
//   p = p * (1 - lr * wd)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
DPACTOR_MULTIVERSION void adamw_step(const optimizer_config& cfg, std::span<float> p, std::span<const float> grads,
                std::span<const std::span<float>> slots, float scale, double lr, std::int64_t step) noexcept {
  assert(slots.size() == 2);
  const double t = static_cast<double>(step + 1);
  const float decay = static_cast<float>(1.0 - lr * cfg.weight_decay);
  const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - cfg.beta1), one_minus_b2 = static_cast<float>(1.0 - cfg.beta2);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(cfg.beta1, t)));
  const float sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
  const float eps = static_cast<float>(cfg.eps);
  float* m = slots[0].data();
  float* v = slots[1].data();
  float* pp = p.data();
  const float* gp = grads.data();
  for (std::size_t i = 0, n = p.size(); i < n; ++i) {
    const float g = gp[i] * scale;
    pp[i] *= decay;
    m[i] = b1 * m[i] + one_minus_b1 * g;
    v[i] = b2 * v[i] + one_minus_b2 * g * g;
    pp[i] -= step_size * m[i] / (std::sqrt(v[i]) / sqrt_bc2 + eps);
  }
}

}  // namespace

std::optional<optimizer_kind> parse_optimizer(std::string_view name) noexcept {
  if (name == "sgd") return optimizer_kind::sgd;
  if (name == "adamw") return optimizer_kind::adamw;
  return std::nullopt;
}

std::string_view optimizer_name(optimizer_kind kind) noexcept {
  return kind == optimizer_kind::sgd ? "sgd" : "adamw";
}

std::vector<std::string> optimizer_slot_names(const optimizer_config& cfg) {
  if (cfg.kind == optimizer_kind::adamw) return {"exp_avg", "exp_avg_sq"};
  if (cfg.momentum != 0.0) return {"momentum_buffer"};
  return {};
}

void optimizer_step(const optimizer_config& cfg, std::span<float> params, std::span<const float> grads,
                    std::span<const std::span<float>> slots, float grad_scale, double lr, std::int64_t step) noexcept {
  assert(grads.size() >= params.size());
  if (cfg.kind == optimizer_kind::sgd)
    sgd_step(cfg, params, grads, slots, grad_scale, lr, step);
  else
    adamw_step(cfg, params, grads, slots, grad_scale, lr, step);
}

}  // namespace dpactor
