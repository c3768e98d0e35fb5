#include "tensors/finite_check.hpp"

#include <bit>
#include <cmath>

namespace dpactor {
namespace {

constexpr std::uint32_t exponent_bits = 0x7f800000u;  // all ones: inf or NaN

bool nonfinite(float v) noexcept { return (std::bit_cast<std::uint32_t>(v) & exponent_bits) == exponent_bits; }

}  // namespace

std::int64_t count_nonfinite(std::span<const float> values) noexcept {
  std::int64_t n = 0;
  for (const float v : values) n += nonfinite(v) ? 1 : 0;
  return n;
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
