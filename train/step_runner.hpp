#pragma once
// The arithmetic of one training step on one member, without any messaging:
// forward and backward over the member's shard in micro-batches (honouring
// cuts and injected faults), then the step's collectives (See Note [One step
// report] and Note [Sharded optimizer step]). The device actor drives it and
// does the reporting; benchmarks and tests drive it directly.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include <dpactor/job_config.hpp>  // nonfinite_policy
#include "train/device_progress.hpp"
#include "train/fault_plan.hpp"
#include "train/int8_codec.hpp"
#include "train/powersgd.hpp"
#include "train/slice_work.hpp"
#include "train/step_record.hpp"
#include "train/step_shard.hpp"
#include "train/straggler.hpp"
#include "comms/collective.hpp"
#include "comms/counted_collective.hpp"
#include "comms/gradient_buckets.hpp"
#include "comms/summation_tree.hpp"
#include "data/dataset.hpp"
#include "tensors/lr_schedule.hpp"
#include "tensors/replica.hpp"
#include "tensors/rng.hpp"

namespace dpactor {

// Shared by a device and the reducer, in-process. See Note [Cutting a step
// short] and Note [Progress-based hang detection].
struct device_control {
  std::atomic<std::int64_t> cut_step{-1};
  device_progress progress;
  bytes_counter bytes;  // what the device's collectives sent (See Note [Bytes sent])
  std::atomic<std::int64_t> overlapped{0};  // exchanges that ran while the next round computed
};


// Note [Non-finite steps]
// Every member counts the NaN and infinite values in its own gradient sums
// before the step's collectives and adds the count to the step header, which
// also carries the loss sum; the header is all-reduced before the gradients
// (and before any update), so every member sees the same count and loss and
// makes the same choice: a step with a non-finite loss or any non-finite
// gradient is not applied by anyone. Its gradients are not reduced either
// (nothing would read them). With "skip" the step counter moves on and the
// run goes on; with "stop" every member stops working in the generation, its
// state still the last committed step's, and the reducer stops the run with
// an error naming the step and writes that state as the final checkpoint.

struct injected_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Slots of the step header all-reduced before the gradients: samples, loss sum
// and correct count summed over members, then each member's compute time,
// sample count and returned count in its own slot.
// h_weight: what the update divides the reduced sum by (the samples, or the
// round modes' weights, See Note [Fragments]).
enum header_slot : std::size_t { h_samples = 0, h_loss = 1, h_correct = 2, h_nonfinite = 3, h_weight = 4, h_members = 5 };

class step_runner {
 public:
  using clock = std::chrono::steady_clock;

  struct computed {
    batch_stats stats;
    std::size_t done = 0;  // indices processed; the rest of the shard was cut
    bool sliced = false;   // by compute_slices (reproducible mode)
    std::uint64_t digest = 0;  // sample_digest of the indices trained (See trained_event)
    double compute_s = 0.0;
    clock::time_point start;
    collective* overlapped = nullptr;  // the endpoint whose buckets compute() started
    double schedule_position = 0.0;    // the shard's (See Note [Schedule position])
    double lr_override = 0.0;          // the shard's: > 0 replaces the schedule's rate
    std::int64_t step = 0;
    device_progress* progress = nullptr;  // the member's (See Note [Progress-based hang detection])
    slice_work* work = nullptr;           // compute_slices's
    double weight = -1.0;                 // what the update divides by; negative: the samples (See slice_work::last_weight)
  };

  // `faults` are this device's injected faults (fail, hang, slow, jitter);
  // `buckets` size the gradient buckets on backends that overlap.
  step_runner(int device_id, std::vector<fault_spec> faults, std::uint64_t fault_seed, double late_factor,
              double late_floor_s, bucket_limits buckets = {});

  void add_fault(const fault_spec& f) { faults_.push_back(f); }
  // Whether fault perturb:R@S names this device and `step` (0-based).
  bool perturbs(std::int64_t step) const { return !faults_.empty() && find_fault(fault_kind::perturb, step + 1); }
  // fault spec kill:R@S: the process ends right after this step's exchange.
  bool kills_after(std::int64_t step) const { return !faults_.empty() && find_fault(fault_kind::kill, step + 1); }

  // Forward and backward over the shard. Throws injected_failure. With a
  // `comm` that overlaps compute, the gradient buckets' reductions start
  // during the backward pass of the shard's last micro-batch (See Note
  // [Gradient buckets]); the next synchronize() must use the same `comm`.
  computed compute(const step_shard& shard, replica& model, const dataset& train, device_control& control,
                   const collective_group& group, collective* comm = nullptr);

  // Reproducible mode: claims and computes slices of the step (its own range,
  // then any left unclaimed), holding the complete tree nodes they make (See
  // Note [Stealing slices] and Note [Summation tree]). Throws
  // injected_failure. With `work`, a slice is what `work` computes instead
  // of its gradient sum (See Note [Logical workers]).
  computed compute_slices(const step_shard& shard, replica& model, const dataset& train, device_control& control,
                          const collective_group& group, slice_work* work = nullptr);
  // The slices the last compute_slices computed (its own and stolen ones),
  // and its step (-1: none yet): in the round modes, the logical workers
  // whose states after that round this member wrote.
  std::span<const std::uint32_t> computed_slices() const noexcept { return computed_slices_; }
  std::int64_t computed_step() const noexcept { return computed_step_; }

  // The step's collectives and this member's part of the optimizer step.
  // A member still waiting for others at the deadline tells `observer`.
  // Returns the reduced header. Throws collective_error.
  std::span<const float> synchronize(const computed& c, std::size_t returned, replica& model, collective& comm,
                                     const collective_options& options, late_observer* observer,
                                     const lr_schedule& schedule);
  // See Note [Overlapped delayed rounds]: what synchronize(c, ..., model,
  // ...) will make of `model`'s parameters in a delayed round (it applies
  // the update model's pending slot holds, which the round's exchange does
  // not change), made on `shadow`, a replica holding model's state, with the
  // same calls of update(): the next round can start from it while the
  // exchange runs. Not for a round that flushes.
  void preview_update(const computed& c, replica& shadow, const lr_schedule& schedule);
  // The learning rate the last synchronize() applied.
  double applied_lr() const noexcept { return lr_; }
  // Whether the last synchronize() applied its update: false for a step with
  // non-finite values (See Note [Non-finite steps]).
  bool applied() const noexcept { return applied_; }
  void set_nonfinite_policy(nonfinite_policy p) noexcept { nonfinite_ = p; }
  // The members gather the reduced gradients and each updates the whole
  // state, on any backend: the round modes do, as their outer step comes once
  // a round and gathering the state would send the outer momentum too.
  void set_gather_gradients(bool on) noexcept { gather_gradients_ = on; }
  // The round modes' int8 codec (See Note [Int8 pseudo-gradients]): a sliced
  // step's slices are kept apart, quantized with the scales every member
  // agrees on, and exchanged as int8 sums; each slice's residual goes back to
  // its slice_work.
  void set_int8_codec(bool on) noexcept { int8_ = on; }
  // The bf16 codec (See Note [Bf16 pseudo-gradients]): the slices are kept
  // apart too, rounded to bf16, and reduced as the tree's leaves. In
  // every_step too (See Note [Bf16 steps]): a step not sliced (fast mode)
  // is one leaf a member.
  void set_bf16_codec(bool on) noexcept { bf16_ = on; }
  // sync.codec = "powersgd" in every_step (See Note [PowerSGD steps]): from
  // its start step, a sliced step's slices are kept apart, each with its
  // residual, and the step's gradients travel as factors; a step not sliced
  // (fast mode) is one unit a member, with this member's residual.
  void set_powersgd(std::shared_ptr<const powersgd_setup> setup) noexcept { powersgd_ = std::move(setup); }
  // sync.fragments (See Note [Fragments]): step s reduces and updates only
  // fragment s mod P of the parameters; the rest of the state carries over.
  void set_fragments(std::int64_t p) noexcept { fragments_ = std::max<std::int64_t>(1, p); }

  // The buckets planned for `model` (planned on first use).
  std::span<const gradient_bucket> buckets(const replica& model);
  // Buckets of the current step whose reduction started during backward.
  std::size_t buckets_started_in_backward() const noexcept { return starter_.during_backward(); }

 private:
  // Starts the buckets' reductions as backward completes them.
  class bucket_starter final : public gradient_listener {
   public:
    void begin_step(std::span<const gradient_bucket> buckets, collective* comm, void* stream);
    void on_gradients_ready(std::span<float> gradients, std::size_t tensor) override;
    // Starts the buckets not started yet.
    void finish(std::span<float> gradients);
    std::size_t during_backward() const noexcept { return during_backward_; }

   private:
    std::span<const gradient_bucket> buckets_;
    collective* comm_ = nullptr;
    void* stream_ = nullptr;
    std::size_t next_ = 0;
    std::size_t during_backward_ = 0;
  };

  const fault_spec* find_fault(fault_kind kind, std::int64_t step_number) const;
  // The step's injected jitter, failure and hang; returns its slow-down, if any.
  const fault_spec* inject_step_faults(const step_shard& shard, const device_control& control,
                                       const collective_group& group);
  // The optimizer step on this member's chunk of each part, and the gather.
  // `reduced_whole`: every member holds the whole reduced gradient already.
  std::span<const float> update(replica& model, collective& comm, const collective_options& options, double lr,
                                std::span<const gradient_bucket> parts, std::int64_t step, device_progress& progress,
                                bool reduced_whole = false);
  // A step not applied (See Note [Non-finite steps]).
  std::span<const float> skip(replica& model);
  // A sliced step not applied: its slices keep the state they started from
  // (slice_work::discard).
  std::span<const float> skip(replica& model, const computed& c);
  // The int8 codec's exchange: the reduced sum lands whole in `grads`.
  void exchange_int8(const computed& c, std::size_t begin, std::size_t end, std::span<float> grads, collective& comm,
                     const collective_options& options);
  void exchange_bf16(const computed& c, std::size_t begin, std::size_t end, std::span<float> grads, collective& comm,
                     const collective_options& options);
  // Fast mode's bf16 step: this member's gradient sum is leaf `rank` of a
  // tree over the members.
  void exchange_bf16_members(std::span<float> grads, collective& comm, const collective_options& options);
  // Rounds this member's chunk of the reduced `sum` to bf16 and gathers the
  // others': every member ends with the same bf16-rounded sum.
  void gather_bf16_sum(std::span<float> sum, collective& comm, const collective_options& options);
  // A codec keeps the slices apart.
  bool keeps_leaves() const noexcept { return int8_ || bf16_ || compresses(computed_step_); }
  // Whether step `step` travels as PowerSGD's factors.
  bool compresses(std::int64_t step) const noexcept { return powersgd_ && powersgd_->compresses(step); }
  const powersgd_plan& powersgd_plan_of(const replica& model);
  // See Note [PowerSGD steps]: the sliced step's exchange (its slices'
  // residuals added by compute_slices), and fast mode's, this member one
  // unit. The step header (filled) travels with the first message; false if
  // the summed header says the step is not finite, and then nothing else
  // is sent or kept. Otherwise the applied gradient sum lands whole in `grads`.
  bool exchange_powersgd(const computed& c, const replica& model, std::span<float> grads, collective& comm,
                         const collective_options& header_options, const collective_options& options);
  bool exchange_powersgd_members(const replica& model, std::span<float> grads, collective& comm,
                                 const collective_options& header_options, const collective_options& options);
  // Every member's chunk of a reduce-scattered `sum` gathered: every member
  // holds the whole.
  static void gather_sum(std::span<float> sum, collective& comm, const collective_options& options);
  // Where `parts` leave gaps in the parameter section, the state carries
  // over into the pending state (See Note [Fragments]).
  static void carry_gaps(replica& model, std::span<const gradient_bucket> parts, double lr);
  // The buffers of the slices or nodes this member holds.
  std::vector<std::size_t> held_buffers() const;
  std::span<const float> reduce_header(const computed& c, std::size_t returned, collective& comm,
                                       const collective_options& options, late_observer* observer,
                                       device_progress& progress);
  // The header's parts of reduce_header(): this member's values into
  // header_ and the options of the wait for it; then what the reduced
  // header tells (the members' compute times).
  collective_options fill_header(const computed& c, std::size_t returned, const collective& comm,
                                 const collective_options& options, late_observer* observer,
                                 device_progress& progress);
  void absorb_header(const collective& comm);
  // See Note [One call a step].
  std::span<const float> synchronize_in_one_call(const computed& c, replica& model, collective& comm,
                                                 const collective_options& options, late_observer* observer,
                                                 device_progress& progress);
  void poison_gradients(const computed& c, replica& model);
  // NaN and infinite values in the gradient sums this member holds.
  std::int64_t count_nonfinite_gradients(const computed& c, replica& model);
  // After the header: whether every member goes on with the step's update.
  bool header_is_finite() const noexcept;
  // Zeroes the region of a model's buffers (See Note [Module buffers]).
  static void clear_buffers(replica& model, std::span<float> grads);
  // A step's computation begins: its shard's schedule, the clock, the phase.
  static computed start_computing(const step_shard& shard, device_control& control);

  // Marks backward (the first layer gradients done) and passes them on.
  class backward_marker final : public gradient_listener {
   public:
    void begin(device_progress* progress, std::int64_t step, gradient_listener* next) noexcept;
    void on_gradients_ready(std::span<float> gradients, std::size_t tensor) override;

   private:
    device_progress* progress_ = nullptr;
    std::int64_t step_ = 0;
    gradient_listener* next_ = nullptr;
    bool marked_ = false;
  };
  backward_marker backward_marker_;

  int device_id_;
  double lr_ = 0.0;
  bool applied_ = true;
  std::int64_t nonfinite_local_ = 0;
  nonfinite_policy nonfinite_ = nonfinite_policy::stop;
  bool gather_gradients_ = false;
  bool int8_ = false;
  bool bf16_ = false;
  std::vector<std::vector<std::uint16_t>> leaves_bf16_;  // the bf16 codec's rounded leaves
  std::vector<tree_part_bf16> parts_bf16_;
  std::vector<std::uint16_t> gathered_bf16_;
  std::int64_t fragments_ = 1;
  // See Note [PowerSGD steps]: the setup, the plan of this member's layout,
  // each held unit's messages, their sums, and in fast mode this member's
  // residual and basis.
  std::shared_ptr<const powersgd_setup> powersgd_;
  std::optional<powersgd_plan> powersgd_plan_;
  std::vector<std::vector<float>> p_parts_, q_parts_;
  std::vector<float> p_sum_, q_sum_;
  std::vector<float> member_residual_, member_basis_;
  gradient_bucket fragment_;  // the step's fragment as one part
  // The int8 codec's: the slices held apart (slice, buffer), the workers'
  // block maxima, the plan and the int8 sum.
  std::vector<std::pair<std::size_t, std::size_t>> leaves_;
  std::vector<std::uint32_t> computed_slices_;
  std::int64_t computed_step_ = -1;
  std::vector<float> maxima_;
  int8_plan int8_plan_;
  std::vector<std::int8_t> int8_sum_;
  std::vector<fault_spec> faults_;
  std::uint64_t fault_seed_;
  std::optional<rng> jitter_rng_;
  double late_factor_;
  double late_floor_s_;
  std::vector<float> header_;
  bucket_limits bucket_limits_;
  std::vector<gradient_bucket> buckets_;
  bucket_starter starter_;
  gradient_bucket whole_;                       // the gradients as one part, without buckets
  std::vector<std::span<float>> gather_parts_;  // state sections cut by bucket
  rolling_median compute_times_{64};  // of complete shards, all members (from the headers)
  // Reproducible mode's, kept with their capacity.
  std::optional<summation_tree> tree_;
  tree_builder builder_;
  std::vector<std::span<float>> buffers_;  // gradients(), then scratch_gradients()
  std::vector<std::size_t> free_;          // buffers holding no node
  std::vector<tree_part> parts_;
};

}  // namespace dpactor
