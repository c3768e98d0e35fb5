#pragma once
// CSV datasets: one sample per line, an integer class label in one column and
// numeric features in the others, comma-separated, optional header line.

#include <filesystem>

#include "data/dataset.hpp"

namespace dpactor {

struct csv_options {
  bool header = false;   // skip the first line
  int label_column = 0;  // 0-based; negative counts from the end (-1 = last)
  int num_classes = 0;
};

// Throws data_error naming the file, line and field of the first problem:
// missing file, empty file, a row with a different field count, a value that
// is not a number, a label that is not an integer or is outside
// [0, num_classes) (checked as written, before any narrowing).
dataset read_csv(const std::filesystem::path& path, const csv_options& options);

}  // namespace dpactor
