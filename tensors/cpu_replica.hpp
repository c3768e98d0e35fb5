#pragma once
// The CPU replica: a compute_model (the native MLP, GEMMs through OpenBLAS
// on the calling thread, or a libtorch module) over host flat buffers.

#include <memory>
#include <vector>

#include "tensors/aligned_buffer.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

class cpu_replica final : public replica {
 public:
  // `micro_batch`: rows per forward/backward call (the workspace size).
  cpu_replica(mlp_spec spec, optimizer_config opt, std::size_t micro_batch);
  // Any model; its max_batch() is the micro-batch.
  cpu_replica(std::unique_ptr<compute_model> model, optimizer_config opt);

  const compute_model& model() const noexcept { return *model_; }
  const state_layout& layout() const noexcept override { return layout_; }
  std::size_t max_rows() const noexcept override { return model_->max_batch(); }

  void zero_grad() override;
  using replica::accumulate;
  batch_stats accumulate(const batch_ref& rows, gradient_listener* listener) override;
  batch_stats evaluate(const batch_ref& rows) override;
  double samples() const override { return samples_; }
  batch_stats accumulate_slice(const batch_ref& rows, std::span<float> grads) override;
  std::span<float> scratch_gradients(std::size_t i) override;
  bool computes_slices() const noexcept override { return true; }
  std::span<float> gradients() override;
  void apply_update(double lr, double total_samples, std::size_t begin, std::size_t end) override;
  void finish_step() override;
  void skip_step() override;
  void update_in_place(double lr, double total_samples) override;
  void flush_next_update() override { flush_ = true; }
  std::span<const std::span<float>> state_sections() override { return sections_[1 - current_]; }

  std::span<float> state_buffer() override { return state().span(); }
  std::int64_t optimizer_steps() const override { return read_step_counter(state().span(), layout_); }
  std::vector<float> export_state() const override;
  void import_state(std::span<const float> state) override;
  void copy_parameters(std::span<float> out) const override;
  std::uint64_t state_checksum() const override;

 private:
  // Copies the rows into x_ and y_; returns the row count.
  std::size_t gather(const batch_ref& rows);
  // The optimizer step for [begin, end) from the current state into `to`
  // (the pending sections, or the current ones to update in place).
  void write_update(double lr, double total_samples, std::size_t begin, std::size_t end,
                    const std::vector<std::span<float>>& to);
  aligned_buffer<float>& state() noexcept { return states_[current_]; }
  const aligned_buffer<float>& state() const noexcept { return states_[current_]; }

  optimizer_config opt_;
  state_layout layout_;
  std::unique_ptr<compute_model> model_;
  aligned_buffer<float> states_[2];  // current and pending; See Note [Pending state]
  int current_ = 0;
  aligned_buffer<float> grads_;  // gradient sums (parameter layout)
  bool grads_written_ = true;    // false after zero_grad() until the first accumulate() writes them
  double samples_ = 0.0;
  bool flush_ = false;  // See flush_next_update()
  std::vector<aligned_buffer<float>> scratch_;  // See scratch_gradients()
  aligned_buffer<float> x_;      // (micro_batch, inputs)
  aligned_buffer<std::int32_t> y_;
  std::vector<std::span<float>> sections_[2];  // per state buffer: parameters, then each slot
};

}  // namespace dpactor
