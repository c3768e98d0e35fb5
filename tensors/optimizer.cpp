#include "tensors/optimizer.hpp"

#include "tensors/simd.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>

namespace dpactor {
namespace {

// The kernels are written once, over separate input and output pointers,
// and instantiated twice below: for distinct buffers (the pending state) and
// for an update in place. Each instance tells the compiler what may alias,
// so that it vectorises without run-time alias checks (AdamW's seven
// pointers exceed GCC's limit on those checks: it fell back to scalar code,
// 4x slower).

// torch.optim.SGD:
//   g = grad + wd * p
//   buf = g on the first step, else momentum * buf + (1 - dampening) * g
//   g = g + momentum * buf (nesterov) or buf
//   p = p - lr * g
[[gnu::always_inline]] inline void sgd_body(const optimizer_config& cfg, const float* p_in, float* p_out,
                                            const float* gp, const float* buf_in, float* buf_out, std::size_t n,
                                            float scale, double lr, std::int64_t step) noexcept {
  const float wd = static_cast<float>(cfg.weight_decay);
  const float lr_f = static_cast<float>(lr);
  if (cfg.momentum == 0.0) {
    for (std::size_t i = 0; i < n; ++i) {
      const float p = p_in[i];
      const float g = gp[i] * scale + wd * p;
      p_out[i] = p - lr_f * g;
    }
    return;
  }
  const float mom = static_cast<float>(cfg.momentum);
  const float keep = static_cast<float>(1.0 - cfg.dampening);
  const bool first = step == 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float p = p_in[i];
    const float g = gp[i] * scale + wd * p;
    const float b = first ? g : mom * buf_in[i] + keep * g;
    buf_out[i] = b;
    const float d = cfg.nesterov ? g + mom * b : b;
    p_out[i] = p - lr_f * d;
  }
}

DPACTOR_MULTIVERSION void sgd_apart(const optimizer_config& cfg, const float* __restrict p_in, float* __restrict p_out,
                                    const float* __restrict gp, const float* __restrict buf_in,
                                    float* __restrict buf_out, std::size_t n, float scale, double lr,
                                    std::int64_t step) noexcept {
  sgd_body(cfg, p_in, p_out, gp, buf_in, buf_out, n, scale, lr, step);
}

DPACTOR_MULTIVERSION void sgd_in_place(const optimizer_config& cfg, float* __restrict p, const float* __restrict gp,
                                       float* __restrict buf, std::size_t n, float scale, double lr,
                                       std::int64_t step) noexcept {
  sgd_body(cfg, p, p, gp, buf, buf, n, scale, lr, step);
}

// torch.optim.AdamW (amsgrad off), t = step + 1:
//   p = p * (1 - lr * wd)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
[[gnu::always_inline]] inline void adamw_body(const optimizer_config& cfg, const float* p_in, float* p_out,
                                              const float* gp, const float* m_in, float* m_out, const float* v_in,
                                              float* v_out, std::size_t n, float scale, double lr,
                                              std::int64_t step) noexcept {
  const double t = static_cast<double>(step + 1);
  const float decay = static_cast<float>(1.0 - lr * cfg.weight_decay);
  const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - cfg.beta1), one_minus_b2 = static_cast<float>(1.0 - cfg.beta2);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(cfg.beta1, t)));
  const float sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
  const float eps = static_cast<float>(cfg.eps);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gp[i] * scale;
    const float p = p_in[i] * decay;
    const float m = b1 * m_in[i] + one_minus_b1 * g;
    const float v = b2 * v_in[i] + one_minus_b2 * g * g;
    m_out[i] = m;
    v_out[i] = v;
    p_out[i] = p - step_size * m / (std::sqrt(v) / sqrt_bc2 + eps);
  }
}

DPACTOR_MULTIVERSION void adamw_apart(const optimizer_config& cfg, const float* __restrict p_in,
                                      float* __restrict p_out, const float* __restrict gp, const float* __restrict m_in,
                                      float* __restrict m_out, const float* __restrict v_in, float* __restrict v_out,
                                      std::size_t n, float scale, double lr, std::int64_t step) noexcept {
  adamw_body(cfg, p_in, p_out, gp, m_in, m_out, v_in, v_out, n, scale, lr, step);
}

DPACTOR_MULTIVERSION void adamw_in_place(const optimizer_config& cfg, float* __restrict p, const float* __restrict gp,
                                         float* __restrict m, float* __restrict v, std::size_t n, float scale,
                                         double lr, std::int64_t step) noexcept {
  adamw_body(cfg, p, p, gp, m, m, v, v, n, scale, lr, step);
}

// See Note [Delayed rounds]: the last slot holds the update the previous
// call brought (its gradient times its scale), which this call applies, and
// keeps this call's; a flush applies both, the held one first, and keeps
// nothing.
void delayed_sgd(const optimizer_config& cfg, std::span<const float> params_in, std::span<float> params_out,
                 std::span<const float> grads, std::span<const std::span<const float>> slots_in,
                 std::span<const std::span<float>> slots_out, float grad_scale, double lr, std::int64_t step,
                 bool flush) noexcept {
  const std::size_t n = params_out.size();
  const bool momentum = cfg.momentum != 0.0;
  assert(slots_out.size() == (momentum ? 2u : 1u));
  const float* held_in = slots_in.back().data();
  float* held_out = slots_out.back().data();
  constexpr std::size_t chunk = 256;
  std::array<float, chunk> held, fresh;
  for (std::size_t at = 0; at < n; at += chunk) {
    const std::size_t m = std::min(chunk, n - at);
    for (std::size_t i = 0; i < m; ++i) {
      held[i] = held_in[at + i];
      fresh[i] = grads[at + i] * grad_scale;
    }
    // The kernels the other steps use, so that the arithmetic is theirs
    // (the same contractions into fused multiply-adds).
    float* buf_out = momentum ? slots_out[0].data() + at : nullptr;
    if (params_in.data() == params_out.data())
      sgd_in_place(cfg, params_out.data() + at, held.data(), buf_out, m, 1.0f, lr, step);
    else
      sgd_apart(cfg, params_in.data() + at, params_out.data() + at, held.data(),
                momentum ? slots_in[0].data() + at : nullptr, buf_out, m, 1.0f, lr, step);
    if (flush) {
      sgd_in_place(cfg, params_out.data() + at, fresh.data(), buf_out, m, 1.0f, lr, step + 1);
      std::fill_n(held_out + at, m, 0.0f);
    } else {
      std::copy_n(fresh.data(), m, held_out + at);
    }
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
  std::vector<std::string> slots;
  if (cfg.momentum != 0.0) slots.emplace_back("momentum_buffer");
  if (cfg.delayed) slots.emplace_back("pending");
  return slots;
}

void optimizer_step(const optimizer_config& cfg, std::span<const float> params_in, std::span<float> params_out,
                    std::span<const float> grads, std::span<const std::span<const float>> slots_in,
                    std::span<const std::span<float>> slots_out, float grad_scale, double lr, std::int64_t step,
                    bool flush) noexcept {
  const std::size_t n = params_out.size();
  assert(params_in.size() == n && grads.size() >= n && slots_in.size() == slots_out.size());
  // In place: every output is its input; otherwise no two buffers overlap.
  const bool in_place = params_in.data() == params_out.data();
  for (std::size_t s = 0; s < slots_out.size(); ++s) assert((slots_in[s].data() == slots_out[s].data()) == in_place);
  if (cfg.delayed) {
    assert(cfg.kind == optimizer_kind::sgd);
    delayed_sgd(cfg, params_in, params_out, grads, slots_in, slots_out, grad_scale, lr, step, flush);
  } else if (cfg.kind == optimizer_kind::sgd) {
    const bool momentum = cfg.momentum != 0.0;
    assert(slots_out.size() == (momentum ? 1u : 0u));
    float* buf_out = momentum ? slots_out[0].data() : nullptr;
    if (in_place)
      sgd_in_place(cfg, params_out.data(), grads.data(), buf_out, n, grad_scale, lr, step);
    else
      sgd_apart(cfg, params_in.data(), params_out.data(), grads.data(), momentum ? slots_in[0].data() : nullptr, buf_out,
                n, grad_scale, lr, step);
  } else {
    assert(slots_out.size() == 2);
    if (in_place)
      adamw_in_place(cfg, params_out.data(), grads.data(), slots_out[0].data(), slots_out[1].data(), n, grad_scale, lr,
                     step);
    else
      adamw_apart(cfg, params_in.data(), params_out.data(), grads.data(), slots_in[0].data(), slots_out[0].data(),
                  slots_in[1].data(), slots_out[1].data(), n, grad_scale, lr, step);
  }
}

void optimizer_step(const optimizer_config& cfg, std::span<float> params, std::span<const float> grads,
                    std::span<const std::span<float>> slots, float grad_scale, double lr, std::int64_t step) noexcept {
  std::array<std::span<const float>, 2> in;
  for (std::size_t s = 0; s < slots.size() && s < in.size(); ++s) in[s] = slots[s];
  optimizer_step(cfg, params, params, grads, std::span<const std::span<const float>>(in.data(), slots.size()), slots,
                 grad_scale, lr, step);
}

}  // namespace dpactor
