#pragma once
// Loads the train and test sets a job config names, scales the features, and
// checks them against the model: feature count, label range, sizes.

#include <memory>
#include <string>

#include <dpactor/data_config.hpp>
#include "data/dataset.hpp"

namespace dpactor {

struct train_test_data {
  std::shared_ptr<const dataset> train;
  std::shared_ptr<const dataset> test;
};

// Throws data_error naming the file and the problem.
// `inputs_key`: what sets the model's input width, for messages.
train_test_data load_data(const data_config& config, int model_inputs, int model_classes,
                          const std::string& inputs_key = "the model's input layer (model.layers[0])");

// Scales both sets with statistics of the training set:
//   max:         x / max|x|            (255 for 8-bit images)
//   standardize: (x - mean_f) / std_f  per feature
void scale_features(feature_scaling scaling, dataset& train, dataset& test);

}  // namespace dpactor
