#include "tensors/finite_check.hpp"

#include <algorithm>
#include <bit>

#include "tensors/simd.hpp"

namespace dpactor {
namespace {

constexpr std::uint32_t exponent_bits = 0x7f800000u;  // all ones: inf or NaN

bool nonfinite(float v) noexcept { return (std::bit_cast<std::uint32_t>(v) & exponent_bits) == exponent_bits; }

}  // namespace

namespace {

// Vectorized: 32-bit counts over blocks short enough not to overflow.
DPACTOR_MULTIVERSION std::int64_t count_nonfinite_in(const float* values, std::size_t n) noexcept {
  constexpr std::size_t block = std::size_t{1} << 20;
  std::int64_t total = 0;
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t end = std::min(n, at + block);
    std::uint32_t count = 0;
    for (std::size_t i = at; i < end; ++i) count += (std::bit_cast<std::uint32_t>(values[i]) & exponent_bits) == exponent_bits;
    total += count;
  }
  return total;
}

}  // namespace

std::int64_t count_nonfinite(std::span<const float> values) noexcept {
  return count_nonfinite_in(values.data(), values.size());
}

std::optional<std::size_t> first_nonfinite(std::span<const float> values) noexcept {
  // Blocks of the fast count first: data is almost always all finite.
  constexpr std::size_t block = 4096;
  for (std::size_t at = 0; at < values.size(); at += block) {
    const auto part = values.subspan(at, std::min(block, values.size() - at));
    if (count_nonfinite(part) == 0) continue;
    for (std::size_t i = 0; i < part.size(); ++i)
      if (nonfinite(part[i])) return at + i;
  }
  return std::nullopt;
}

}  // namespace dpactor
