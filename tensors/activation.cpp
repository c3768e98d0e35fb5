#include "tensors/activation.hpp"

#include "tensors/simd.hpp"

#include <cmath>

namespace dpactor {
namespace {

constexpr float inv_sqrt2 = 0.70710678118654752f;
constexpr float inv_sqrt_2pi = 0.39894228040143268f;

inline float sigmoid(float z) noexcept { return 1.0f / (1.0f + std::exp(-z)); }
inline float gelu(float z) noexcept { return 0.5f * z * (1.0f + std::erf(z * inv_sqrt2)); }
inline float gelu_grad(float z) noexcept {
  return 0.5f * (1.0f + std::erf(z * inv_sqrt2)) + z * inv_sqrt_2pi * std::exp(-0.5f * z * z);
}

// Derivative expressed through what the forward pass kept.
inline float derivative_from_saved(activation act, float saved) noexcept {
  switch (act) {
    case activation::identity: return 1.0f;
    case activation::relu: return saved > 0.0f ? 1.0f : 0.0f;
    case activation::tanh: return 1.0f - saved * saved;
    case activation::sigmoid: return saved * (1.0f - saved);
    case activation::gelu: return gelu_grad(saved);
  }
  return 1.0f;
}

template <class F>
void forward_rows(std::size_t rows, std::size_t cols, const float* bias, float* z, float* a, F f) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    float* zr = z + r * cols;
    float* ar = a + r * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      float v = zr[c] + bias[c];
      zr[c] = v;
      ar[c] = f(v);
    }
  }
}

template <class F>
void backward_rows(std::size_t rows, std::size_t cols, const float* saved, float* grad, float* bias_grad,
                   F dfdsaved) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* sr = saved + r * cols;
    float* gr = grad + r * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      float g = gr[c] * dfdsaved(sr[c]);
      gr[c] = g;
      bias_grad[c] += g;
    }
  }
}

}  // namespace

std::optional<activation> parse_activation(std::string_view name) noexcept {
  if (name == "relu") return activation::relu;
  if (name == "gelu") return activation::gelu;
  if (name == "tanh") return activation::tanh;
  if (name == "sigmoid") return activation::sigmoid;
  if (name == "identity" || name == "none") return activation::identity;
  return std::nullopt;
}

std::string_view activation_name(activation act) noexcept {
  switch (act) {
    case activation::identity: return "identity";
    case activation::relu: return "relu";
    case activation::gelu: return "gelu";
    case activation::tanh: return "tanh";
    case activation::sigmoid: return "sigmoid";
  }
  return "?";
}

bool activation_backward_needs_input(activation act) noexcept { return act == activation::gelu; }

float activation_value(activation act, float z) noexcept {
  switch (act) {
    case activation::identity: return z;
    case activation::relu: return z > 0.0f ? z : 0.0f;
    case activation::gelu: return gelu(z);
    case activation::tanh: return std::tanh(z);
    case activation::sigmoid: return sigmoid(z);
  }
  return z;
}

float activation_derivative(activation act, float z) noexcept {
  if (activation_backward_needs_input(act)) return derivative_from_saved(act, z);
  return derivative_from_saved(act, activation_value(act, z));
}

DPACTOR_MULTIVERSION void bias_activation_forward(activation act, std::size_t rows, std::size_t cols, const float* bias, float* z,
                             float* a) noexcept {
  switch (act) {
    case activation::identity: forward_rows(rows, cols, bias, z, a, [](float v) { return v; }); break;
    case activation::relu: forward_rows(rows, cols, bias, z, a, [](float v) { return v > 0.0f ? v : 0.0f; }); break;
    case activation::gelu: forward_rows(rows, cols, bias, z, a, gelu); break;
    case activation::tanh: forward_rows(rows, cols, bias, z, a, [](float v) { return std::tanh(v); }); break;
    case activation::sigmoid: forward_rows(rows, cols, bias, z, a, sigmoid); break;
  }
}

DPACTOR_MULTIVERSION void bias_activation_backward(activation act, std::size_t rows, std::size_t cols, const float* saved, float* grad,
                              float* bias_grad) noexcept {
  switch (act) {
    case activation::identity: backward_rows(rows, cols, saved, grad, bias_grad, [](float) { return 1.0f; }); break;
    case activation::relu:
      backward_rows(rows, cols, saved, grad, bias_grad, [](float s) { return s > 0.0f ? 1.0f : 0.0f; });
      break;
    case activation::gelu: backward_rows(rows, cols, saved, grad, bias_grad, gelu_grad); break;
    case activation::tanh: backward_rows(rows, cols, saved, grad, bias_grad, [](float s) { return 1.0f - s * s; }); break;
    case activation::sigmoid:
      backward_rows(rows, cols, saved, grad, bias_grad, [](float s) { return s * (1.0f - s); });
      break;
  }
}

}  // namespace dpactor
