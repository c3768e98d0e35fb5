#pragma once
// Non-finite values (NaN, +-inf) in float data: the numerical guards' one
// primitive (training steps, inputs, initial weights, checkpoints).

#include <cstdint>
#include <optional>
#include <span>

namespace dpactor {

// How many values are NaN or infinite. Branch-free and vectorized: a pass
// over the gradients costs about as much as reading them once.
std::int64_t count_nonfinite(std::span<const float> values) noexcept;

// The index of the first NaN or infinite value, if any.
std::optional<std::size_t> first_nonfinite(std::span<const float> values) noexcept;

}  // namespace dpactor
