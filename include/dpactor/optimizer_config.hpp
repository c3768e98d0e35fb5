#pragma once
// The [optimizer] and [schedule] sections of a job config (public API;
// docs/config.md). The update formulas are tensors/optimizer.hpp, the rates
// tensors/lr_schedule.hpp.

namespace dpactor {

enum class optimizer_kind { sgd, adamw };

struct optimizer_config {
  optimizer_kind kind = optimizer_kind::sgd;
  double lr = 0.1;
  double momentum = 0.9;      // SGD
  double dampening = 0.0;     // SGD
  bool nesterov = false;      // SGD
  double weight_decay = 0.0;  // SGD: L2 added to the gradient; AdamW: decoupled
  double beta1 = 0.9;         // AdamW
  double beta2 = 0.999;       // AdamW
  double eps = 1e-8;          // AdamW
  // Not a config key: the engine sets it on sync.delay = 1's outer optimizer
  // (SGD), which applies each update one call late (docs/async.md).
  bool delayed = false;
};

enum class schedule_kind { constant, step, cosine };

}  // namespace dpactor
