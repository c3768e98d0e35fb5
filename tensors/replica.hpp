#pragma once
// A model replica: parameters, gradients and optimizer state of one device.
// The CPU replica implements it here, around a compute_model (the native MLP
// or a libtorch module); the CUDA replica (cuda/) implements the same
// interface with device memory, so the device actor drives either.
//
// Note [Replica state buffer]
// A replica's whole training state is one flat buffer: the parameters, then
// each optimizer slot with the same layout as the parameters, then a small tail
// holding the optimizer step counter. Broadcasting that one buffer from the
// state source makes a newcomer identical to the others in one collective
// call, and checkpoints are cut out of it by tensor name.
//
// Note [Module buffers]
// A torch module's buffers (BatchNorm's running statistics) follow DDP's
// default: every replica starts a step from the same buffers, and after it
// all hold the first rank's, updated by its own forward passes. They are the
// last tensors of the parameter section (layout().buffer_begin on), so the
// state buffer, its broadcast, the checkpoints (under their state_dict
// names) and the pending state carry them like parameters. In a step each
// member writes its updated buffers into the same region of its gradients,
// and every member but rank 0 zeroes that region (step_runner), so the
// reduced "gradient" there is rank 0's buffers exactly (x + 0 = x); the
// update copies it instead of stepping it. In reproducible mode the
// contributor is the step's first slice, whoever computes it, and every
// slice starts from the step's buffers: the bytes do not depend on the
// number of replicas.
//
// Note [Sharded optimizer step]
// The optimizer is element-wise, so the members split its work: the gradients
// are reduce-scattered (each member sums the part it owns, in rank order),
// each member updates its part of the parameters and of every optimizer slot,
// and the parts are all-gathered. Every element of the new state is computed
// by exactly one member and copied to the others, so replicas stay bitwise
// identical, parameters and optimizer state alike; on N members each does 1/N
// of the optimizer's memory traffic. The step's sample count travels in the
// small header all-reduced before the gradients (See Note [One step report]),
// since every member needs the total.
//
// Note [Pending state]
// A step writes the new state into a second buffer and swaps it in only once
// every part has arrived. A collective aborted half-way (a member failed
// between the reduce-scatter and the end of the all-gather) then leaves each
// replica's current state exactly as it was after the previous step, never a
// mix of parts from two steps, so any survivor can be the next state source.
// The optimizer reads the current and writes the pending state: no extra
// pass over memory. A member alone updates in place (update_in_place).

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensors/finite_check.hpp"
#include <dpactor/flat_layout.hpp>
#include "tensors/mlp.hpp"
#include "tensors/optimizer.hpp"

namespace dpactor {

// Rows of a dataset: features (rows, feature_count) and labels, addressed by
// sample index. The replica gathers the rows it is given.
struct batch_ref {
  const float* features = nullptr;
  std::size_t feature_count = 0;
  const std::int32_t* labels = nullptr;
  std::span<const std::uint32_t> indices;
  std::size_t rows = 0;  // rows of the whole dataset (a GPU replica copies it once)
};

// See Note [Replica state buffer].
struct state_layout {
  flat_layout layout;               // parameters, then slot tensors "<param>.<slot>"
  std::size_t parameter_tensors = 0;
  std::size_t parameter_size = 0;   // floats of the parameter section, padding included
  // Where a model's buffers (BatchNorm's running statistics) start in the
  // parameter section: they are its last tensors, not trained but copied
  // (See Note [Module buffers]). parameter_size: none.
  std::size_t buffer_begin = 0;
  std::vector<std::string> slots;   // optimizer slot names

  // The parameter section's tensors alone, as a layout of their own.
  flat_layout parameters() const;

  // Floats after the layout holding the step counter.
  static constexpr std::size_t tail_floats = 16;
  std::size_t total_size() const noexcept { return layout.size() + tail_floats; }
};

// `buffer_begin`: where the buffers start among `parameters` (its size: none).
state_layout make_state_layout(const flat_layout& parameters, const optimizer_config& opt,
                               std::size_t buffer_begin = static_cast<std::size_t>(-1));
state_layout make_state_layout(const mlp_spec& spec, const optimizer_config& opt);

// Reads and writes the step counter kept in the tail of a state buffer.
std::int64_t read_step_counter(std::span<const float> state, const state_layout& layout) noexcept;
void write_step_counter(std::span<float> state, const state_layout& layout, std::int64_t steps) noexcept;

// Hears during backward that gradients are final, for overlapping their
// reduction with the rest of backward (See Note [Gradient buckets]).
class gradient_listener {
 public:
  virtual ~gradient_listener() = default;
  // The gradients of parameter tensor `tensor` and of every tensor after it
  // are final; `gradients` is the whole gradient buffer (replica::gradients()).
  // On a GPU replica the kernels producing them are enqueued on
  // native_stream(), not necessarily done.
  virtual void on_gradients_ready(std::span<float> gradients, std::size_t tensor) = 0;
};

class replica {
 public:
  virtual ~replica() = default;

  virtual const state_layout& layout() const noexcept = 0;
  // Largest number of rows accumulate() and evaluate() take in one call.
  virtual std::size_t max_rows() const noexcept = 0;

  // Zeroes the gradient sums and the sample count.
  virtual void zero_grad() = 0;
  // Forward and backward over at most max_rows() rows; adds the gradient sums
  // and counts the rows. If `listener` is set, tells it as each layer's
  // gradients become final (pass it for a step's last micro-batch only).
  virtual batch_stats accumulate(const batch_ref& rows, gradient_listener* listener) = 0;
  batch_stats accumulate(const batch_ref& rows) { return accumulate(rows, nullptr); }
  virtual batch_stats evaluate(const batch_ref& rows) = 0;
  // The rows of a coming accumulate() or evaluate() call, so that a replica
  // that copies them to a device can start early; the call may not come.
  virtual void prefetch(const batch_ref& /*rows*/) {}
  // Rows accumulated since zero_grad().
  virtual double samples() const = 0;

  // Reproducible mode (See Note [Summation tree]): forward and backward over
  // one slice of at most max_rows() rows, its gradient sums *written* into
  // `grads` (gradients() itself, or a scratch_gradients() buffer).
  virtual batch_stats accumulate_slice(const batch_ref& rows, std::span<float> grads);
  // Gradient-sized buffers for the tree's nodes (the i-th, made on first use
  // and kept), in the memory gradients() lives in.
  virtual std::span<float> scratch_gradients(std::size_t i);
  // Whether the replica computes slices (the two calls above).
  virtual bool computes_slices() const noexcept { return false; }
  // a[i] += b[i] over two of those buffers, where they live: the tree's one
  // addition (tree_builder). Host memory by default; a GPU replica adds on
  // its device, and its buffers are complete on return, as gradients()'
  // (See Note [The tree on a device]).
  virtual void add_gradients(std::span<float> into, std::span<const float> from);
  // NaN and infinite values among one of those buffers (the step's guard,
  // over the tree nodes a member holds). Host memory by default.
  virtual std::int64_t count_nonfinite_in(std::span<const float> values) { return count_nonfinite(values); }

  // The gradient sums, laid out like the parameters (layout().parameter_size
  // floats): what the collective reduces. Complete on return (a GPU replica
  // waits for its stream).
  virtual std::span<float> gradients() = 0;
  // The queue that produces this replica's gradients, for a collective to
  // order its work after (a cudaStream_t); null where work is done on return.
  virtual void* native_stream() noexcept { return nullptr; }
  // Writes the optimizer step for elements [begin, end) of the parameter
  // section and of each slot section into the *pending* state, from the
  // current state and the reduced gradients divided by `total_samples` (See
  // Note [Sharded optimizer step] and Note [Pending state]).
  virtual void apply_update(double lr, double total_samples, std::size_t begin, std::size_t end) = 0;
  // The pending state's parameter section, then each slot section: what the
  // owners of the updated parts gather to everyone.
  virtual std::span<const std::span<float>> state_sections() = 0;
  // Makes the pending state current, one optimizer step further; call once
  // per step after the gather completed.
  virtual void finish_step() = 0;
  // The whole optimizer step, written straight into the current state, for a
  // member alone in its group: it gathers nothing, so no collective can fail
  // between the update and the end of the step, and the pending copy (and its
  // memory traffic) is not needed. Same arithmetic as apply_update over the
  // whole parameter section followed by finish_step(), which is the default.
  virtual void update_in_place(double lr, double total_samples) {
    apply_update(lr, total_samples, 0, layout().parameter_size);
    finish_step();
  }
  // NaN and infinite values among the gradient sums: the step's numerical
  // guard (train.on_nonfinite). Host memory by default; a GPU replica counts
  // on its device.
  virtual std::int64_t count_nonfinite_gradients() { return count_nonfinite(gradients()); }
  // A step whose update is skipped (train.on_nonfinite = "skip"): parameters
  // and optimizer slots stay as they are, the step counter moves on by one,
  // so that the counter still numbers the steps of the run.
  virtual void skip_step() = 0;
  // sync.delay's run's last round (See Note [Delayed rounds]): the next
  // update (apply_update or update_in_place, up to finish_step) also applies
  // the update its delayed optimizer holds, and keeps none. Only replicas
  // that run the round modes have one.
  virtual void flush_next_update() {
    throw std::logic_error("this replica kind has no delayed optimizer (sync.delay)");
  }

  // See Note [Replica state buffer]. For the CPU replica the span is host
  // memory; for a GPU replica it is device memory.
  virtual std::span<float> state_buffer() = 0;
  virtual std::int64_t optimizer_steps() const = 0;
  // Called after state_buffer() was overwritten in place (a broadcast), so a
  // replica that mirrors part of it elsewhere can reload it.
  virtual void on_state_replaced() {}
  // Host copies, in the state layout (total_size() floats).
  virtual std::vector<float> export_state() const = 0;
  virtual void import_state(std::span<const float> state) = 0;
  // Copies the parameter section only (layout().parameter_size floats).
  virtual void copy_parameters(std::span<float> out) const = 0;
  // FNV-1a over the bytes of the current state (parameters, every optimizer
  // slot, the step counter): equal replicas have equal checksums.
  virtual std::uint64_t state_checksum() const = 0;
};

std::uint64_t checksum_floats(std::span<const float> values) noexcept;

}  // namespace dpactor
