#include "comms/rank_order.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "tensors/simd.hpp"

namespace dpactor {
namespace {

// Chunk boundaries fall on cache lines so that two ranks never write one line.
constexpr std::size_t chunk_alignment = 16;  // floats
// Floats summed per block: the block's partial sums stay in registers/L1.
constexpr std::size_t reduce_block = 512;

}  // namespace

std::pair<std::size_t, std::size_t> rank_chunk(std::size_t size, int ranks, int rank) noexcept {
  const auto n = static_cast<std::size_t>(ranks);
  const std::size_t share = (size + n - 1) / n;
  const std::size_t per = (share + chunk_alignment - 1) / chunk_alignment * chunk_alignment;
  const std::size_t begin = std::min(size, per * static_cast<std::size_t>(rank));
  return {begin, std::min(size, begin + per)};
}

DPACTOR_MULTIVERSION void sum_in_rank_order(std::span<const float* const> parts, std::size_t len,
                                            std::span<float* const> outs) noexcept {
  std::array<float, reduce_block> acc;
  for (std::size_t b = 0; b < len; b += reduce_block) {
    const std::size_t n = std::min(reduce_block, len - b);
    std::memcpy(acc.data(), parts[0] + b, n * sizeof(float));
    for (std::size_t k = 1; k < parts.size(); ++k) {
      const float* src = parts[k] + b;
      for (std::size_t i = 0; i < n; ++i) acc[i] += src[i];
    }
    for (float* out : outs) std::memcpy(out + b, acc.data(), n * sizeof(float));
  }
}

DPACTOR_MULTIVERSION void sum_int8(std::span<const std::int8_t* const> parts, std::size_t len,
                                   std::span<std::int8_t* const> outs) noexcept {
  std::array<std::int8_t, 4 * reduce_block> acc;
  for (std::size_t b = 0; b < len; b += acc.size()) {
    const std::size_t n = std::min(acc.size(), len - b);
    std::memcpy(acc.data(), parts[0] + b, n);
    for (std::size_t k = 1; k < parts.size(); ++k) {
      const std::int8_t* src = parts[k] + b;
      for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<std::int8_t>(acc[i] + src[i]);
    }
    for (std::int8_t* out : outs) std::memcpy(out + b, acc.data(), n);
  }
}

}  // namespace dpactor
