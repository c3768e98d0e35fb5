#pragma once
// The libtorch replica's boundary (model.kind = "torchscript"): a TorchScript
// module whose parameters and gradients live in dpactor's flat buffers, run
// by a CPU replica like the native MLP (tensors/compute_model.hpp).
//
// Note [The libtorch plugin]
// libtorch lives in its own shared object, torch/ (libdpactor_torch.so,
// built when libtorch is found: DPACTOR_WITH_TORCH), loaded with dlopen the
// first time a torch model is asked for. Linking libtorch into the engine
// would add 0.7-1.3 s of start-up (its relocations and static
// initialisers) to every dpactor process, MLP jobs and every test program
// alike; loaded on demand, a plain job never maps it. Only this header's
// types cross the boundary, through one extern "C" function; errors come
// back as text and are thrown here as config_error, so no exception type
// crosses it. The plugin is looked for in $DPACTOR_TORCH_PLUGIN, next to
// the program (../lib/dpactor/), then where it was installed and built.
// OMP_WAIT_POLICY is set to PASSIVE before it loads (unless set): spinning
// OpenMP threads on busy cores made a 2 ms step 31 ms.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensors/compute_model.hpp"
#include "tensors/loss.hpp"

namespace dpactor {

struct torch_model_options {
  std::string path;                       // a file saved by torch.jit.script(model).save(path)
  std::vector<std::int64_t> input_shape;  // one sample's shape; empty: [features]
  std::size_t features = 0;               // the data's features per sample (checked against input_shape)
  loss_kind loss = loss_kind::cross_entropy;
  std::size_t max_batch = 1;              // rows per forward/backward call
  int threads = 1;                        // intra-op threads of the calling thread
};

// What the file holds, checked: the parameters (state_dict names and
// shapes), their values as saved, and the outputs per sample.
class torch_model : public compute_model {
 public:
  // The module's parameter values as saved, laid out by layout().
  virtual void initial_parameters(std::span<float> out) const = 0;
};

// Makes a replica's model: open_torch_model for a TorchScript file, or an
// embedder's (dpactor/torch_module.hpp: from a torch::nn::Module factory).
// Each call is one replica's own module; throws config_error.
using torch_model_factory = std::function<std::unique_ptr<torch_model>(const torch_model_options& options)>;

// Loads the module (and, the first time, the plugin). Throws config_error
// naming the file: missing, not TorchScript, saved by a newer PyTorch, an
// input shape that does not match the data, outputs that are not one row
// of scores per sample, parameters that are not float32, none trainable;
// and, in a build without the plugin, one that says how to enable it.
std::unique_ptr<torch_model> open_torch_model(const torch_model_options& options);

// The plugin's file, or why there is none (then empty; `why` says).
std::string find_torch_plugin(std::string& why);

}  // namespace dpactor

// The plugin's one entry point: a new model, or null with the reason in
// `error` (at most error_size bytes, NUL-terminated).
extern "C" {
using dpactor_torch_open_fn = dpactor::torch_model* (*)(const dpactor::torch_model_options* options, char* error,
                                                        std::size_t error_size);
}
