#pragma once
// How a logical worker's state is laid out (See Note [Logical workers]): in
// the store, in a device's exported state and in workers.safetensors.
//
// Note [A logical worker's state]
// Worker after worker, each:
//   the inner replica's state from its parameter section's end on: the
//     optimizer slots, then the tail with the step counter;
//   with a codec (sync.codec other than "fp32"), the residual: one float a
//     parameter (See Note [Int8 pseudo-gradients]);
//   with fragments (sync.fragments = P > 1), the worker's own inner
//     parameters, which live across steps (See Note [Fragments]), then P
//     floats: the samples it trained since each fragment's last exchange;
//   with the one-round delay (sync.delay = 1), its progress: one float a
//     parameter, what its last round added to the weights it started from,
//     not yet in the global weights (See Note [Delayed rounds]).

#include <cstddef>
#include <utility>

#include "tensors/replica.hpp"

namespace dpactor {

struct worker_state_shape {
  std::size_t parameters = 0;  // p
  std::size_t kept = 0;        // the slots and the tail
  bool residual = false;
  std::size_t fragments = 1;
  bool delayed = false;

  static worker_state_shape of(const state_layout& inner, bool residual, std::size_t fragments,
                               bool delayed = false) noexcept {
    return {inner.parameter_size, inner.total_size() - inner.parameter_size, residual, fragments, delayed};
  }
  bool own_parameters() const noexcept { return fragments > 1; }
  std::size_t residual_at() const noexcept { return kept; }
  std::size_t parameters_at() const noexcept { return kept + (residual ? parameters : 0); }
  // The delay's progress sits where fragments keep the own parameters (a run
  // has one or the other, never both).
  std::size_t progress_at() const noexcept { return parameters_at(); }
  std::size_t samples_at() const noexcept { return parameters_at() + (own_parameters() || delayed ? parameters : 0); }
  std::size_t size() const noexcept { return samples_at() + (own_parameters() ? fragments : 0); }
};

// Note [Fragments]'s split: fragment f of P is the parameters
// [f p / P, (f + 1) p / P) of the p in the flat parameter section.
inline std::pair<std::size_t, std::size_t> fragment_range(std::size_t parameters, std::size_t fragments,
                                                          std::size_t f) noexcept {
  return {f * parameters / fragments, (f + 1) * parameters / fragments};
}

}  // namespace dpactor
