#pragma once
// The [data] section of a job config (public API; docs/config.md).

#include <cstdint>
#include <string>

namespace dpactor {

enum class data_format { idx, csv, synthetic };
enum class feature_scaling { none, max, standardize };

struct data_config {
  data_format format = data_format::idx;
  // idx
  std::string train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  std::string train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";
  std::string test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  std::string test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  // csv
  std::string train_file;
  std::string test_file;
  bool header = false;
  std::int64_t label_column = 0;
  // synthetic
  std::int64_t synthetic_train = 4096;
  std::int64_t synthetic_test = 1024;
  double synthetic_noise = 0.5;
  std::int64_t synthetic_seed = 7;
  // all formats
  feature_scaling scale = feature_scaling::max;
};

}  // namespace dpactor
