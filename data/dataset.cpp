#include "data/dataset.hpp"

#include "tensors/error.hpp"

namespace dpactor {

dataset::dataset(std::string name_, std::size_t rows_, std::size_t feature_count_, int num_classes_)
    : name(std::move(name_)),
      rows(rows_),
      feature_count(feature_count_),
      num_classes(num_classes_),
      features(rows_ * feature_count_),
      labels(rows_) {}

void dataset::check_labels() const {
  for (std::size_t i = 0; i < rows; ++i)
    if (labels[i] < 0 || labels[i] >= num_classes)
      throw data_error(name + ": label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                       " is out of range: the model has " + std::to_string(num_classes) +
                       " classes (labels 0.." + std::to_string(num_classes - 1) + ")");
}

}  // namespace dpactor
