#pragma once
// The CUDA replica: the same interface as the CPU replica (tensors/replica.hpp),
// with parameters, gradients and optimizer state in device memory. A dataset
// is copied to the device the first time it is used and rows are gathered
// there, so a step moves only its indices host to device. Every wait on the
// GPU polls with a deadline (cuda/resources.hpp).

#include <map>
#include <memory>

#include "cuda/blas.hpp"
#include "cuda/resources.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

struct cuda_replica_options {
  int device = 0;
  bool tf32 = false;                                // TF32 tensor cores for the GEMMs
  std::chrono::milliseconds wait_limit{60'000};     // longest wait on the GPU before it counts as hung
};

class cuda_replica final : public replica {
 public:
  cuda_replica(mlp_spec spec, optimizer_config opt, std::size_t micro_batch, cuda_replica_options options);
  ~cuda_replica() override;

  const mlp_spec& spec() const noexcept override { return spec_; }
  const state_layout& layout() const noexcept override { return layout_; }
  std::size_t max_rows() const noexcept override { return micro_batch_; }

  void zero_grad() override;
  batch_stats accumulate(const batch_ref& rows) override;
  batch_stats evaluate(const batch_ref& rows) override;
  double samples() const override { return samples_; }
  std::span<float> gradients() override;
  void apply_update(double lr, double total_samples, std::size_t begin, std::size_t end) override;
  void finish_step() override;
  std::span<const std::span<float>> state_sections() override { return sections_[1 - current_]; }

  std::span<float> state_buffer() override;  // writes the step counter into the tail first
  std::int64_t optimizer_steps() const override { return steps_; }
  void on_state_replaced() override;
  std::vector<float> export_state() const override;
  void import_state(std::span<const float> state) override;
  void copy_parameters(std::span<float> out) const override;
  std::uint64_t parameter_checksum() const override;

 private:
  struct device_dataset {
    device_buffer<float> features;
    device_buffer<std::int32_t> labels;
  };
  // Gathers the rows on the device; returns the row count.
  std::size_t gather(const batch_ref& rows);
  const device_dataset& on_device(const batch_ref& rows);
  // Forward pass; returns the output block (n, classes).
  const float* forward(std::size_t n);
  // Gathers the rows, clears the loss counters and runs the forward pass;
  // sets n to the row count and returns the outputs (null for no rows).
  const float* begin_pass(const batch_ref& rows, std::size_t& n);
  batch_stats read_stats(std::size_t n);
  void sync(cudaStream_t stream) const;
  const device_buffer<float>& state() const noexcept { return states_[current_]; }

  // Makes the replica's device current before the members below allocate.
  struct device_selection {
    explicit device_selection(int device) { CUDA_CHECK(cudaSetDevice(device)); }
  };

  device_selection selected_;
  mlp_spec spec_;
  optimizer_config opt_;
  state_layout layout_;
  flat_layout params_;
  std::size_t micro_batch_;
  cuda_replica_options options_;
  cuda_stream stream_;
  cublas_handle blas_;
  device_buffer<float> states_[2];  // current and pending: See Note [Pending state]
  int current_ = 0;
  device_buffer<float> grads_;
  std::vector<std::span<float>> sections_[2];
  std::vector<device_buffer<float>> outputs_, inputs_;
  device_buffer<float> grad_a_, grad_b_, x_;
  device_buffer<std::int32_t> y_;
  pinned_buffer<std::uint32_t> host_indices_;
  device_buffer<std::uint32_t> indices_;
  device_buffer<double> loss_sum_;
  device_buffer<unsigned long long> correct_;
  std::map<const float*, device_dataset> datasets_;
  std::int64_t steps_ = 0;
  double samples_ = 0.0;
  bool grads_written_ = true;
};

}  // namespace dpactor
