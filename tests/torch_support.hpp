#pragma once
// What the libtorch tests (torch_model_test, torch_engine_test) share: the
// committed TorchScript files, tensors' values as floats, and the skip where
// the plugin is not built. These tests link libtorch for their references;
// dpactor reaches it through the plugin, as the engine does (See Note [The
// libtorch plugin]).

#include <string>
#include <vector>

#include <torch/torch.h>

#include "tests/test_support.hpp"

namespace dpactor::testing {

// The tests' TorchScript files (tests/data/torch/*.pt), and the CNN of
// configs/cnn.cfg.
inline const std::string torch_models = std::string(DPACTOR_SOURCE_DIR) + "/tests/data/torch/";
inline const std::string cnn_module = std::string(DPACTOR_SOURCE_DIR) + "/configs/cnn.pt";

// A tensor's values, in its own order.
inline std::vector<float> values(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// The values of every tensor of `tensors` (a module's parameters), one after
// the other.
template <class Tensors>
std::vector<float> concatenated_values(const Tensors& tensors) {
  std::vector<float> out;
  for (const torch::Tensor& t : tensors) {
    const auto v = values(t);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace dpactor::testing

#define SKIP_WITHOUT_TORCH() DPACTOR_SKIP_WITHOUT(::dpactor::testing::replica_kind::torch)
