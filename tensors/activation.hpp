#pragma once
// Fused bias + activation, forward and backward, for a (rows, cols) row-major
// block. PyTorch's definitions: relu, gelu (exact, erf-based), tanh, sigmoid.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <dpactor/model_spec.hpp>

namespace dpactor {

std::optional<activation> parse_activation(std::string_view name) noexcept;
std::string_view activation_name(activation act) noexcept;

// Whether the backward pass needs the pre-activation z (gelu) rather than the
// output a = act(z) (relu, tanh, sigmoid, identity).
bool activation_backward_needs_input(activation act) noexcept;

// z(rows, cols) += bias(cols); a = act(z). `a` may alias `z` when the backward
// pass does not need z.
void bias_activation_forward(activation act, std::size_t rows, std::size_t cols, const float* bias,
                             float* z, float* a) noexcept;

// grad(rows, cols): in dL/da, out dL/dz = dL/da * act'(z); bias_grad(cols) +=
// column sums of dL/dz. `saved` is z when activation_backward_needs_input(act),
// else a.
void bias_activation_backward(activation act, std::size_t rows, std::size_t cols, const float* saved,
                              float* grad, float* bias_grad) noexcept;

// Scalar definitions, shared with tests and reference code.
float activation_value(activation act, float z) noexcept;
// Derivative of act at z.
float activation_derivative(activation act, float z) noexcept;

}  // namespace dpactor
