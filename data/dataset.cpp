#include "data/dataset.hpp"

#include <cstdint>
#include <new>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

// rows x feature_count floats, checked before anything is allocated: a size
// whose byte count overflows (and would wrap to a small buffer) is refused.
std::size_t checked_feature_values(const std::string& name, std::size_t rows, std::size_t feature_count) {
  std::size_t values = 0, bytes = 0;
  if (__builtin_mul_overflow(rows, feature_count, &values) || __builtin_mul_overflow(values, sizeof(float), &bytes) ||
      bytes > static_cast<std::size_t>(PTRDIFF_MAX))
    throw data_error(name + ": " + std::to_string(rows) + " samples x " + std::to_string(feature_count) +
                     " features do not fit in memory (the size in bytes overflows)");
  return values;
}

}  // namespace

dataset::dataset(std::string name_, std::size_t rows_, std::size_t feature_count_, int num_classes_)
    : name(std::move(name_)), rows(rows_), feature_count(feature_count_), num_classes(num_classes_) {
  const std::size_t values = checked_feature_values(name, rows, feature_count);
  try {
    features = aligned_buffer<float>(values);
    labels = aligned_buffer<std::int32_t>(rows);
  } catch (const std::bad_alloc&) {
    throw data_error(name + ": " + std::to_string(rows) + " samples x " + std::to_string(feature_count) +
                     " features need " + std::to_string(values * sizeof(float) + rows * sizeof(std::int32_t)) +
                     " bytes, more memory than can be allocated");
  }
}

void dataset::check_labels() const {
  for (std::size_t i = 0; i < rows; ++i)
    if (labels[i] < 0 || labels[i] >= num_classes)
      throw data_error(name + ": label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                       " is out of range: the model has " + std::to_string(num_classes) +
                       " classes (labels 0.." + std::to_string(num_classes - 1) + ")");
}

}  // namespace dpactor
