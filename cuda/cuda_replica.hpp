#pragma once
// The CUDA replica: the same interface as the CPU replica (tensors/replica.hpp),
// with parameters, gradients and optimizer state in device memory. Every wait
// on the GPU polls with a deadline (cuda/resources.hpp).
//
// Note [Data on the GPU]
// A dataset that fits (by default: at most half of the free device memory,
// as Fashion-MNIST does by far) is copied to the device the first time it is
// used and rows are gathered there, so a step moves only its indices host to
// device. A larger one is streamed: the rows of a micro-batch are gathered on
// the host into one of two pinned staging slots and copied on a copy stream;
// the compute stream waits for that copy on the GPU, and the copy of a slot
// waits for the pass that last read it. With prefetch() the next
// micro-batch's copy runs while the current one computes.

#include <map>
#include <memory>

#include "cuda/blas.hpp"
#include "cuda/resources.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

enum class cuda_data_placement { automatic, resident, streamed };

struct cuda_replica_options {
  int device = 0;
  cuda_data_placement data = cuda_data_placement::automatic;  // See Note [Data on the GPU]
  bool tf32 = false;                                // TF32 tensor cores for the GEMMs
  std::chrono::milliseconds wait_limit{60'000};     // longest wait on the GPU before it counts as hung
};

class cuda_replica final : public replica {
 public:
  cuda_replica(mlp_spec spec, optimizer_config opt, std::size_t micro_batch, cuda_replica_options options);
  ~cuda_replica() override;

  const mlp_spec& spec() const noexcept { return spec_; }
  const state_layout& layout() const noexcept override { return layout_; }
  std::size_t max_rows() const noexcept override { return micro_batch_; }

  void zero_grad() override;
  using replica::accumulate;
  batch_stats accumulate(const batch_ref& rows, gradient_listener* listener) override;
  batch_stats evaluate(const batch_ref& rows) override;
  // Reproducible mode (See Note [Summation tree] and Note [The tree on a
  // device]): a slice's gradients written into a device buffer, the tree's
  // additions on this replica's stream, each buffer complete on return.
  batch_stats accumulate_slice(const batch_ref& rows, std::span<float> grads) override;
  std::span<float> scratch_gradients(std::size_t i) override;
  bool computes_slices() const noexcept override { return true; }
  void add_gradients(std::span<float> into, std::span<const float> from) override;
  std::int64_t count_nonfinite_in(std::span<const float> values) override;
  void prefetch(const batch_ref& rows) override;
  double samples() const override { return samples_; }
  std::span<float> gradients() override;
  void* native_stream() noexcept override { return stream_.get(); }
  void apply_update(double lr, double total_samples, std::size_t begin, std::size_t end) override;
  void finish_step() override;
  void skip_step() override { ++steps_; }
  std::int64_t count_nonfinite_gradients() override;
  void update_in_place(double lr, double total_samples) override;
  std::span<const std::span<float>> state_sections() override { return sections_[1 - current_]; }

  std::span<float> state_buffer() override;  // writes the step counter into the tail first
  std::int64_t optimizer_steps() const override { return steps_; }
  void on_state_replaced() override;
  std::vector<float> export_state() const override;
  void import_state(std::span<const float> state) override;
  void copy_parameters(std::span<float> out) const override;
  std::uint64_t state_checksum() const override;

 private:
  struct device_dataset {
    device_buffer<float> features;
    device_buffer<std::int32_t> labels;
  };
  // See Note [Data on the GPU].
  struct staging_slot {
    pinned_buffer<float> features;
    pinned_buffer<std::int32_t> labels;
    device_buffer<float> device_features;
    device_buffer<std::int32_t> device_labels;
    cuda_event copied;    // on the copy stream: the rows are on the device
    cuda_event consumed;  // on the compute stream: the last pass reading them is done
    bool used = false;
    // What a prefetch put there, to be claimed by the matching call.
    std::uint64_t ticket = 0;  // 0: nothing waiting to be claimed
    const float* features_of = nullptr;  // the dataset
    const std::uint32_t* indices = nullptr;
    std::size_t n = 0;
    std::uint32_t first = 0, last = 0;
  };
  // Gathers the rows on the device, sets input_ and labels_; returns the row count.
  std::size_t gather(const batch_ref& rows);
  const device_dataset& on_device(const batch_ref& rows);
  bool resident(const batch_ref& rows);
  // Gathers the rows into the next staging slot and starts their copy.
  staging_slot& stage(const batch_ref& rows);
  // The slot a prefetch of these rows filled, or null.
  staging_slot* claim(const batch_ref& rows);
  // After a pass: the slot it read may be refilled once the pass is done.
  void release_input();
  // Releases the pass's input however the pass ends (a listener may throw).
  struct input_release {
    cuda_replica& replica;
    ~input_release() {
      try {
        replica.release_input();
      } catch (...) {  // the device failed: the pass's error is what gets reported
      }
    }
  };
  // Backward from the loss of the current pass into `grads` (added to what
  // is there, or written over it when `overwrite`).
  void backward(std::size_t n, const float* out, float* grads, bool overwrite, gradient_listener* listener);
  // Forward pass; returns the output block (n, classes).
  const float* forward(std::size_t n);
  // Gathers the rows, clears the loss counters and runs the forward pass;
  // sets n to the row count and returns the outputs (null for no rows).
  const float* begin_pass(const batch_ref& rows, std::size_t& n);
  batch_stats read_stats(std::size_t n);
  // The optimizer step for [begin, end) from the current state into `to`.
  void write_update(double lr, double total_samples, std::size_t begin, std::size_t end,
                    const std::vector<std::span<float>>& to);
  void sync(cudaStream_t stream) const;
  // Pinned memory for whole-state copies, and a device-to-host copy through it.
  float* staging() const;
  void download(float* out, const float* from, std::size_t n) const;
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
  std::vector<device_buffer<float>> scratch_;  // See scratch_gradients()
  std::vector<std::span<float>> sections_[2];
  std::vector<device_buffer<float>> outputs_, inputs_;
  device_buffer<float> grad_a_, grad_b_, x_;
  device_buffer<std::int32_t> y_;
  pinned_buffer<std::uint32_t> host_indices_;
  device_buffer<std::uint32_t> indices_;
  struct small_values {  // pinned: See read_stats()
    double loss = 0.0;
    unsigned long long correct = 0;
    std::int64_t steps = 0;
    unsigned long long nonfinite = 0;
  };
  pinned_buffer<small_values> host_small_;
  mutable pinned_buffer<float> staging_;  // See staging()
  device_buffer<double> loss_sum_;
  device_buffer<unsigned long long> nonfinite_;
  device_buffer<unsigned long long> correct_;
  std::map<const float*, device_dataset> datasets_;
  std::map<const float*, bool> resident_;  // per dataset: See Note [Data on the GPU]
  cuda_stream copy_stream_;
  staging_slot slots_[2];
  int next_slot_ = 0;
  std::uint64_t tickets_ = 0;
  staging_slot* input_slot_ = nullptr;  // the slot the current pass reads, if streamed
  const float* input_ = nullptr;        // the current pass's rows (n, features) ...
  const std::int32_t* labels_ = nullptr;  // ... and labels, on the device
  std::int64_t steps_ = 0;
  double samples_ = 0.0;
  bool grads_written_ = true;
};

}  // namespace dpactor
