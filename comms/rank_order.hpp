#pragma once
// How every backend that reduces on the host cuts a buffer among the ranks
// and sums it: rank r owns chunk r and sums it in rank order 0, 1, ..., n-1.
// The local backend (threads), the driver group and the Gloo backend
// (processes) all call these two functions, so a buffer reduced by any of them
// is bitwise the same (See Note [Bitwise identical replicas]): reproducible
// mode's bytes do not depend on whether the ranks are threads or processes.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace dpactor {

// See collective::chunk: rank `rank`'s part [begin, end) of a buffer of `size`
// floats, cache-line-aligned parts of ceil(size / ranks); the parts tile the
// buffer in rank order, and the last ones may be empty.
std::pair<std::size_t, std::size_t> rank_chunk(std::size_t size, int ranks, int rank) noexcept;

// sum[i] = parts[0][i] + parts[1][i] + ... (in that order, one float at a time)
// for i in [0, len), written to every pointer in `outs` (an out may be a part).
void sum_in_rank_order(std::span<const float* const> parts, std::size_t len, std::span<float* const> outs) noexcept;

// The same over int8 values whose every partial sum fits in int8 (See
// collective::all_reduce_sum_int8): exact, so the order is only habit.
void sum_int8(std::span<const std::int8_t* const> parts, std::size_t len, std::span<std::int8_t* const> outs) noexcept;

}  // namespace dpactor
