#pragma once
// A synthetic classification dataset for tests and benchmarks: each class is a
// Gaussian blob around a random centre; the same seed gives the same data.

#include <cstdint>

#include "data/dataset.hpp"

namespace dpactor {

struct synthetic_options {
  std::size_t rows = 4096;
  std::size_t features = 32;
  int classes = 4;
  float noise = 0.5f;        // standard deviation around each class centre
  std::uint64_t seed = 1;    // the centres depend on this only, so train and
  std::uint64_t stream = 0;  // test sets (different streams) share them
};

dataset make_synthetic(const synthetic_options& options);

}  // namespace dpactor
