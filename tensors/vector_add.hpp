#pragma once
// a[i] += b[i]: the one addition of the summation tree (See Note [Summation
// tree], comms/summation_tree.hpp), on host memory. Element-wise, so any
// processor that adds the same two floats gets the same bits.

#include <cstddef>

namespace dpactor {

// Multi-versioned for the CPU (tensors/simd.hpp).
void add_into(float* a, const float* b, std::size_t n) noexcept;

}  // namespace dpactor
