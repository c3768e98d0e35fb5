#include "data/loading.hpp"

#include <cmath>
#include <vector>

#include "data/csv_reader.hpp"
#include "data/idx_reader.hpp"
#include "data/synthetic.hpp"
#include <dpactor/error.hpp>
#include "tensors/finite_check.hpp"

namespace dpactor {
namespace {

dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int classes) {
  if (images_path.empty() || labels_path.empty())
    throw data_error("data.format = \"idx\" needs data.train_images, data.train_labels, data.test_images and data.test_labels");
  idx_array images = read_idx(images_path);
  idx_array labels = read_idx(labels_path);
  if (images.dims.size() < 2)
    throw data_error(images_path + ": expected at least 2 dimensions (samples, features...), found " +
                     std::to_string(images.dims.size()));
  if (labels.dims.size() != 1)
    throw data_error(labels_path + ": expected 1 dimension (samples), found " + std::to_string(labels.dims.size()));
  if (images.dims[0] != labels.dims[0])
    throw data_error(images_path + " has " + std::to_string(images.dims[0]) + " samples but " + labels_path + " has " +
                     std::to_string(labels.dims[0]) + " labels");
  const std::size_t rows = images.dims[0];
  const std::size_t features = rows == 0 ? 0 : images.values.size() / rows;
  dataset out(images_path, rows, features, classes);
  std::copy(images.values.begin(), images.values.end(), out.features.data());
  for (std::size_t i = 0; i < rows; ++i) {
    const float v = labels.values[i];
    if (v < 0.0f || v >= static_cast<float>(classes) || v != std::floor(v))
      throw data_error(labels_path + ": label " + (v == std::floor(v) && std::abs(v) < 1e15f
                                                        ? std::to_string(static_cast<long long>(v))
                                                        : std::to_string(v)) +
                       " of sample " +
                       std::to_string(i) + " is out of range: the model has " + std::to_string(classes) +
                       " classes (labels 0.." + std::to_string(classes - 1) + ")");
    out.labels[i] = static_cast<std::int32_t>(v);
  }
  return out;
}

void check_against_model(const dataset& d, int model_inputs, const std::string& inputs_key) {
  if (d.rows == 0) throw data_error(d.name + ": contains no samples");
  if (d.feature_count != static_cast<std::size_t>(model_inputs))
    throw data_error(d.name + ": samples have " + std::to_string(d.feature_count) + " features but " + inputs_key +
                     " has " + std::to_string(model_inputs));
  // See Note [Non-finite steps]: NaN in an input poisons every replica at once.
  const std::span<const float> values(d.features.data(), d.rows * d.feature_count);
  if (const auto at = first_nonfinite(values))
    throw data_error(d.name + ": sample " + std::to_string(*at / d.feature_count) + " (0-based), feature " +
                     std::to_string(*at % d.feature_count) + ": the value is " + std::to_string(values[*at]) +
                     "; inputs must be finite");
}

}  // namespace

void scale_features(feature_scaling scaling, dataset& train, dataset& test) {
  const std::size_t f = train.feature_count;
  if (scaling == feature_scaling::max) {
    float max = 0.0f;
    for (std::size_t i = 0; i < train.features.size(); ++i) max = std::max(max, std::abs(train.features[i]));
    if (max == 0.0f) return;
    const float inv = 1.0f / max;
    for (dataset* d : {&train, &test})
      for (std::size_t i = 0; i < d->features.size(); ++i) d->features[i] *= inv;
  } else if (scaling == feature_scaling::standardize) {
    std::vector<double> mean(f, 0.0), sq(f, 0.0);
    for (std::size_t r = 0; r < train.rows; ++r)
      for (std::size_t c = 0; c < f; ++c) {
        const double v = train.features[r * f + c];
        mean[c] += v;
        sq[c] += v * v;
      }
    std::vector<float> shift(f), inv_std(f);
    for (std::size_t c = 0; c < f; ++c) {
      const double m = mean[c] / static_cast<double>(train.rows);
      const double var = sq[c] / static_cast<double>(train.rows) - m * m;
      shift[c] = static_cast<float>(m);
      inv_std[c] = var > 1e-12 ? static_cast<float>(1.0 / std::sqrt(var)) : 1.0f;
    }
    for (dataset* d : {&train, &test})
      for (std::size_t r = 0; r < d->rows; ++r)
        for (std::size_t c = 0; c < f; ++c) d->features[r * f + c] = (d->features[r * f + c] - shift[c]) * inv_std[c];
  }
}

train_test_data load_data(const data_config& config, int model_inputs, int model_classes, const std::string& inputs_key) {
  dataset train, test;
  switch (config.format) {
    case data_format::idx:
      train = load_idx_pair(config.train_images, config.train_labels, model_classes);
      test = load_idx_pair(config.test_images, config.test_labels, model_classes);
      break;
    case data_format::csv: {
      if (config.train_file.empty() || config.test_file.empty())
        throw data_error("data.format = \"csv\" needs data.train_file and data.test_file");
      const csv_options options{config.header, static_cast<int>(config.label_column), model_classes};
      train = read_csv(config.train_file, options);
      test = read_csv(config.test_file, options);
      break;
    }
    case data_format::synthetic: {
      synthetic_options options;
      options.features = static_cast<std::size_t>(model_inputs);
      options.classes = model_classes;
      options.noise = static_cast<float>(config.synthetic_noise);
      options.seed = static_cast<std::uint64_t>(config.synthetic_seed);
      options.rows = static_cast<std::size_t>(config.synthetic_train);
      options.stream = 0;
      train = make_synthetic(options);
      options.rows = static_cast<std::size_t>(config.synthetic_test);
      options.stream = 1;
      test = make_synthetic(options);
      break;
    }
  }
  check_against_model(train, model_inputs, inputs_key);
  check_against_model(test, model_inputs, inputs_key);
  scale_features(config.scale, train, test);
  return {std::make_shared<const dataset>(std::move(train)), std::make_shared<const dataset>(std::move(test))};
}

}  // namespace dpactor
