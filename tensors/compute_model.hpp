#pragma once
// What a CPU replica runs forward and backward: the native MLP (tensors/mlp.hpp)
// or a libtorch module bound onto the same flat buffers (torch/, loaded on
// demand through tensors/torch_model.hpp). The replica around it owns the
// state buffers, the optimizer and the pending state (See Note [Replica state
// buffer]), so every model kind gets collectives, sharded optimizers,
// checkpoints and faults alike.

#include <cstddef>
#include <cstdint>

#include <dpactor/flat_layout.hpp>

namespace dpactor {

struct batch_stats {
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::int64_t samples = 0;

  batch_stats& operator+=(const batch_stats& o) noexcept {
    loss_sum += o.loss_sum;
    correct += o.correct;
    samples += o.samples;
    return *this;
  }
};

// Called during backward with a layer's index once its gradients are written.
struct layer_done_callback {
  void (*call)(void* context, std::size_t layer) = nullptr;
  void* context = nullptr;
};

class compute_model {
 public:
  virtual ~compute_model() = default;

  // Features per sample (the flattened input) and outputs per sample (classes).
  virtual std::size_t inputs() const noexcept = 0;
  virtual std::size_t outputs() const noexcept = 0;
  // Most rows one call takes.
  virtual std::size_t max_batch() const noexcept = 0;
  // The parameters' layout, which the gradients share; a model's buffers
  // are its last tensors, from buffer_begin() on (See Note [Module buffers]).
  virtual const flat_layout& layout() const noexcept = 0;
  virtual std::size_t buffer_begin() const noexcept { return layout().size(); }

  // `params` and `grads` point at buffers laid out by layout(); x(n, inputs),
  // labels(n). Adds the gradient *sums* over the n samples to grads, or with
  // `overwrite` writes them (padding between tensors is left zero).
  // `on_layer_done`, if set, hears layer indices as backward finishes them
  // (the layer's weight is parameter tensor 2 * layer); a model that cannot
  // tell calls it once with 0 when all are final.
  virtual batch_stats forward_backward(const float* params, float* grads, const float* x,
                                       const std::int32_t* labels, std::size_t n, bool overwrite = false,
                                       layer_done_callback on_layer_done = {}) = 0;
  // Loss sum and correct count, no gradients.
  virtual batch_stats evaluate(const float* params, const float* x, const std::int32_t* labels, std::size_t n) = 0;
};

}  // namespace dpactor
