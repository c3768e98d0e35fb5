#pragma once
// An in-memory labelled dataset: features (rows, feature_count) as float, and
// an integer class label per row. Shared read-only by every device actor of a
// process; shards address its rows by index.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensors/aligned_buffer.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

struct dataset {
  std::string name;  // where it came from, for messages
  std::size_t rows = 0;
  std::size_t feature_count = 0;
  int num_classes = 0;
  aligned_buffer<float> features;       // rows * feature_count
  aligned_buffer<std::int32_t> labels;  // rows
  // A stream's step (See Note [Exactly-once offsets]): each row's sequence
  // number. Empty for a file's rows, which are named by their index.
  std::vector<std::int64_t> sequences;

  dataset() = default;
  // Throws data_error naming the sizes when rows x feature_count does not fit
  // in memory (an overflowing size is refused before anything is allocated).
  dataset(std::string name, std::size_t rows, std::size_t feature_count, int num_classes);

  batch_ref batch(std::span<const std::uint32_t> indices) const noexcept {
    return {features.data(), feature_count, labels.data(), indices, rows};
  }
  // Throws data_error naming the first label outside [0, num_classes).
  void check_labels() const;
};

}  // namespace dpactor
