#pragma once
// What one slice of a sliced step computes. By default the slice's gradient
// sum; in the round modes a logical worker's whole round (See Note [Logical
// workers]), whose result the summation tree adds the same way.

#include <cstddef>
#include <cstdint>
#include <span>

#include "data/dataset.hpp"
#include "tensors/replica.hpp"
#include "train/device_progress.hpp"
#include "train/step_shard.hpp"

namespace dpactor {

class slice_work {
 public:
  virtual ~slice_work() = default;
  // Slice `slice` of `shard`, whose rows are `rows`, computed from `model`'s
  // current state; its result *written* into `out` (parameter_size floats).
  virtual batch_stats compute(const step_shard& shard, std::size_t slice, std::span<const std::uint32_t> rows,
                              const dataset& train, replica& model, std::span<float> out,
                              device_progress& progress) = 0;
  // A codec sends less than the slice's result (See Note [Int8
  // pseudo-gradients]): `residual` is what it did not send of slice `slice`
  // of step `step`, told before the exchange. The default keeps nothing.
  virtual void keep_residual(std::int64_t step, std::size_t slice, std::span<const float> residual) {
    (void)step, (void)slice, (void)residual;
  }
  // Step `step`'s slices start from `model`, whose state this is (called
  // once a step, before any of its slices). The default keeps nothing.
  virtual void step_starts(std::int64_t step, std::span<const float> state) { (void)step, (void)state; }
  // The int8 codec's block maxima of every slice of step `step`, as every
  // member planned its scales from them. The default keeps nothing.
  virtual void keep_maxima(std::int64_t step, std::span<const float> maxima) { (void)step, (void)maxima; }
  // Step `step` was not applied (See Note [Non-finite steps]): slice
  // `slice` keeps the state it started the step from (a logical worker does
  // not carry a round whose values were not finite into its next one). The
  // default keeps nothing.
  virtual void discard(std::int64_t step, std::size_t slice) { (void)step, (void)slice; }
  // What the last compute()'s result is weighted by, which the step's update
  // divides the sum by: its samples (negative: the default), or what the
  // work says (See Note [Fragments]).
  virtual double last_weight() const noexcept { return -1.0; }
  // Whether step `step`'s update also applies what a delayed outer
  // optimizer holds (See Note [Delayed rounds]): the run's last round.
  virtual bool flushes(std::int64_t step) const noexcept {
    (void)step;
    return false;
  }
};

}  // namespace dpactor
