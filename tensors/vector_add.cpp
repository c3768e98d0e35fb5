#include "tensors/vector_add.hpp"

#include "tensors/simd.hpp"

namespace dpactor {

DPACTOR_MULTIVERSION void add_into(float* a, const float* b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace dpactor
