#include "train/step_runner.hpp"

#include "train/sample_digest.hpp"
#include "train/bf16_codec.hpp"
#include "train/worker_state.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

namespace dpactor {
namespace {

using clock_type = step_runner::clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Granularity of injected delays: they end early when the step is cut.
constexpr auto delay_slice = std::chrono::microseconds(50);
// A sleep on this kind of machine overshoots by about this much even with a
// 1 ns timer slack: the end of a delay is waited out by yielding instead.
constexpr auto sleep_overshoot = std::chrono::microseconds(60);

bool cut_requested(const device_control& control, std::int64_t step) {
  return control.cut_step.load(std::memory_order_acquire) == step;
}

// Sleeps for `seconds`, or until the step is cut. Precise to a few
// microseconds, so that an injected slow-down factor is the factor asked for.
void injected_delay(const device_control& control, std::int64_t step, double seconds) {
  thread_local const bool precise_timers = ::prctl(PR_SET_TIMERSLACK, 1UL) == 0;
  (void)precise_timers;
  const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  for (auto now = clock_type::now(); now < until && !cut_requested(control, step); now = clock_type::now()) {
    const auto left = until - now;
    if (left > sleep_overshoot) std::this_thread::sleep_for(std::min<clock_type::duration>(delay_slice, left - sleep_overshoot));
    else std::this_thread::yield();
  }
}

}  // namespace

step_runner::step_runner(int device_id, std::vector<fault_spec> faults, std::uint64_t fault_seed, double late_factor,
                         double late_floor_s, bucket_limits buckets)
    : device_id_(device_id),
      faults_(std::move(faults)),
      fault_seed_(fault_seed),
      late_factor_(late_factor),
      late_floor_s_(late_floor_s),
      bucket_limits_(buckets) {}

std::span<const gradient_bucket> step_runner::buckets(const replica& model) {
  if (buckets_.empty()) {
    const state_layout& l = model.layout();
    buckets_ = plan_gradient_buckets(l.layout, l.parameter_tensors, l.parameter_size, bucket_limits_);
  }
  return buckets_;
}

void step_runner::bucket_starter::begin_step(std::span<const gradient_bucket> buckets, collective* comm, void* stream) {
  buckets_ = buckets;
  comm_ = comm;
  stream_ = stream;
  next_ = 0;
  during_backward_ = 0;
}

void step_runner::bucket_starter::on_gradients_ready(std::span<float> gradients, std::size_t tensor) {
  for (; next_ < buckets_.size() && buckets_[next_].lowest_tensor >= tensor; ++next_, ++during_backward_)
    comm_->start_reduce_scatter(gradients.subspan(buckets_[next_].begin, buckets_[next_].size()), stream_);
}

void step_runner::bucket_starter::finish(std::span<float> gradients) {
  for (; next_ < buckets_.size(); ++next_)
    comm_->start_reduce_scatter(gradients.subspan(buckets_[next_].begin, buckets_[next_].size()), stream_);
}

const fault_spec* step_runner::find_fault(fault_kind kind, std::int64_t step) const {
  for (const auto& f : faults_)
    if (f.kind == kind && (kind == fault_kind::jitter || (kind == fault_kind::slow ? step >= f.step : step == f.step)))
      return &f;
  return nullptr;
}

const fault_spec* step_runner::inject_step_faults(const step_shard& shard, const device_control& control,
                                                  const collective_group& group) {
  if (faults_.empty()) return nullptr;
  const std::int64_t step_number = shard.step + 1;  // faults count steps from 1
  if (const fault_spec* f = find_fault(fault_kind::jitter, step_number)) {
    if (!jitter_rng_) jitter_rng_.emplace(fault_seed_, static_cast<std::uint64_t>(device_id_));
    if (jitter_rng_->uniform() < f->probability) injected_delay(control, shard.step, f->delay_ms / 1000.0);
  }
  if (find_fault(fault_kind::fail, step_number))
    throw injected_failure("injected failure (fault spec fail:" + std::to_string(device_id_) + "@" +
                           std::to_string(step_number) + ")");
  if (find_fault(fault_kind::stuck, step_number))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // never returns, as a hung driver call
  if (find_fault(fault_kind::hang, step_number)) {
    // Blocks until the reducer gives up on this member and aborts the group.
    while (!group.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return find_fault(fault_kind::slow, step_number);
}

// See Note [Module buffers]: a member's (or a slice's) buffers that are not
// the step's leave the reduction as zeros.
void step_runner::clear_buffers(replica& model, std::span<float> grads) {
  const state_layout& l = model.layout();
  std::fill(grads.begin() + static_cast<std::ptrdiff_t>(l.buffer_begin),
            grads.begin() + static_cast<std::ptrdiff_t>(l.parameter_size), 0.0f);
}

// A step's computation begins: its shard's schedule, the clock, the phase.
step_runner::computed step_runner::start_computing(const step_shard& shard, device_control& control) {
  computed c;
  c.schedule_position = shard.schedule_position;
  c.lr_override = shard.lr_override;
  c.step = shard.step;
  c.progress = &control.progress;
  c.start = clock_type::now();
  control.progress.mark(device_phase::forward, shard.step);
  return c;
}

step_runner::computed step_runner::compute_slices(const step_shard& shard, replica& model, const dataset& train,
                                                  device_control& control, const collective_group& group,
                                                  slice_work* work) {
  computed c = start_computing(shard, control);
  const fault_spec* slow = inject_step_faults(shard, control, group);
  const std::size_t slices = shard.slices();
  tree_.emplace(slices);
  builder_.reset(*tree_, [&model](std::span<float> a, std::span<const float> b) { model.add_gradients(a, b); });
  buffers_.assign(1, model.gradients());  // the first node the member holds lands where the optimizer reads
  free_.assign(1, 0);
  leaves_.clear();
  computed_slices_.clear();
  computed_step_ = shard.step;
  c.work = work;
  if (work != nullptr) work->step_starts(shard.step, model.state_buffer());
  const std::span<const std::uint32_t> rows = shard.all_indices();
  const auto compute = [&](std::size_t slice) {
    const auto start = clock_type::now();
    if (free_.empty()) {
      free_.push_back(buffers_.size());
      buffers_.push_back(model.scratch_gradients(buffers_.size() - 1));
    }
    const std::size_t buffer = free_.back();
    free_.pop_back();
    const std::size_t at = std::min(rows.size(), slice * shard.slice_rows);  // a round's empty slices start at the end
    const auto slice_rows = rows.subspan(at, std::min<std::size_t>(shard.slice_rows, rows.size() - at));
    control.progress.mark(device_phase::forward, shard.step);
    c.stats += work != nullptr
                   ? work->compute(shard, slice, slice_rows, train, model, buffers_[buffer], control.progress)
                   : model.accumulate_slice(train.batch(slice_rows), buffers_[buffer]);
    if (const double w = work != nullptr ? work->last_weight() : -1.0; w >= 0.0) c.weight = std::max(c.weight, 0.0) + w;
    if (slice != 0) clear_buffers(model, buffers_[buffer]);  // See Note [Module buffers]: slice 0's count
    c.digest += sample_digest(slice_rows, train.sequences);
    computed_slices_.push_back(static_cast<std::uint32_t>(slice));
    if (compresses(shard.step)) {  // See Note [PowerSGD steps]: M = g + e
      const std::vector<float> e = powersgd_->residuals->read(slice, shard.step);
      const std::span<float> m = buffers_[buffer];
      for (std::size_t i = 0; i < e.size(); ++i) m[i] += e[i];
    }
    if (keeps_leaves()) leaves_.emplace_back(slice, buffer);  // encoded apart (See Note [Int8 pseudo-gradients])
    else builder_.add_leaf(slice, buffer, buffers_, free_);
    if (slow != nullptr) injected_delay(control, shard.step, (slow->factor - 1.0) * seconds_since(start));
  };
  // See Note [Stealing slices]: own slices in order, then whatever is left.
  // A shard from another process has no board (none is shared there): its
  // own slices only.
  shard.for_each_owned([&](std::uint32_t s) {
    if (!shard.board || shard.board->claim(s)) compute(s);
  });
  if (shard.board && shard.board->stealing())
    while (const auto s = shard.board->steal()) compute(*s);
  c.done = static_cast<std::size_t>(c.stats.samples);
  c.compute_s = seconds_since(c.start);
  c.sliced = true;
  return c;
}

step_runner::computed step_runner::compute(const step_shard& shard, replica& model, const dataset& train,
                                           device_control& control, const collective_group& group,
                                           collective* comm) {
  computed c = start_computing(shard, control);
  model.zero_grad();
  // See Note [Bf16 steps] and Note [PowerSGD steps]: the codecs reduce after backward.
  const bool overlap = comm != nullptr && comm->overlaps_compute() && !bf16_ && !compresses(shard.step);
  if (overlap) {
    starter_.begin_step(buckets(model), comm, model.native_stream());
    c.overlapped = comm;
  }
  const fault_spec* slow = inject_step_faults(shard, control, group);
  const std::size_t micro = model.max_rows();
  const std::span<const std::uint32_t> rows = shard.all_indices();
  const auto slice_at = [&](std::size_t at) { return rows.subspan(at, std::min(micro, rows.size() - at)); };
  if (!rows.empty()) model.prefetch(train.batch(slice_at(0)));
  while (c.done < rows.size() && !cut_requested(control, shard.step)) {
    const auto slice = slice_at(c.done);
    const auto start = clock_type::now();
    const bool last = c.done + slice.size() == rows.size();
    if (!last) model.prefetch(train.batch(slice_at(c.done + slice.size())));  // See Note [Data on the GPU]
    control.progress.mark(device_phase::forward, shard.step);
    backward_marker_.begin(&control.progress, shard.step, overlap && last ? &starter_ : nullptr);
    c.stats += model.accumulate(train.batch(slice), &backward_marker_);
    c.digest += sample_digest(slice, train.sequences);
    c.done += slice.size();
    if (slow != nullptr) injected_delay(control, shard.step, (slow->factor - 1.0) * seconds_since(start));
  }
  c.compute_s = seconds_since(c.start);
  return c;
}

void step_runner::backward_marker::begin(device_progress* progress, std::int64_t step, gradient_listener* next) noexcept {
  progress_ = progress;
  step_ = step;
  next_ = next;
  marked_ = false;
}

void step_runner::backward_marker::on_gradients_ready(std::span<float> gradients, std::size_t tensor) {
  if (!marked_) {
    progress_->mark(device_phase::backward, step_);
    marked_ = true;
  }
  if (next_ != nullptr) next_->on_gradients_ready(gradients, tensor);
}

std::vector<std::size_t> step_runner::held_buffers() const {
  std::vector<std::size_t> held;
  if (keeps_leaves())
    for (const auto& [slice, buffer] : leaves_) held.push_back(buffer);
  else
    for (const auto& [node, buffer] : builder_.held()) held.push_back(buffer);
  return held;
}

std::int64_t step_runner::count_nonfinite_gradients(const computed& c, replica& model) {
  if (!c.sliced) return model.count_nonfinite_gradients();
  std::int64_t n = 0;
  for (const std::size_t buffer : held_buffers()) n += model.count_nonfinite_in(buffers_[buffer]);
  return n;
}

// fault spec nan:R@S: the first gradient this member holds becomes NaN.
void step_runner::poison_gradients(const computed& c, replica& model) {
  std::span<float> grads = model.gradients();
  if (const auto held = held_buffers(); c.sliced && !held.empty()) grads = buffers_[held.front()];
  if (model.native_stream() == nullptr) {
    grads[0] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  throw std::logic_error("fault spec nan:R@S: only CPU replicas");
}

bool step_runner::header_is_finite() const noexcept {
  return header_[h_nonfinite] == 0.0f && std::isfinite(header_[h_loss]);
}

std::span<const float> step_runner::reduce_header(const computed& c, std::size_t returned, collective& comm,
                                                  const collective_options& options, late_observer* observer,
                                                  device_progress& progress) {
  comm.all_reduce_sum(header_, fill_header(c, returned, comm, options, observer, progress));
  absorb_header(comm);
  return header_;
}

collective_options step_runner::fill_header(const computed& c, std::size_t returned, const collective& comm,
                                            const collective_options& options, late_observer* observer,
                                            device_progress& progress) {
  const auto members = static_cast<std::size_t>(comm.size());
  const auto rank = static_cast<std::size_t>(comm.rank());
  header_.assign(h_members + 3 * members, 0.0f);
  header_[h_samples] = static_cast<float>(c.stats.samples);
  header_[h_loss] = static_cast<float>(c.stats.loss_sum);
  header_[h_correct] = static_cast<float>(c.stats.correct);
  header_[h_nonfinite] = static_cast<float>(nonfinite_local_);
  header_[h_weight] = static_cast<float>(c.weight >= 0.0 ? c.weight : static_cast<double>(c.stats.samples));
  header_[h_members + rank] = static_cast<float>(c.compute_s);
  header_[h_members + members + rank] = static_cast<float>(c.stats.samples);
  header_[h_members + 2 * members + rank] = static_cast<float>(returned);
  // Waiting here past the deadline, tell the observer who is late.
  collective_options header_options = options;
  header_options.observer = observer;
  const double allowed = std::max(late_floor_s_, late_factor_ * compute_times_.median());
  header_options.late_at = c.start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(allowed));
  progress.mark(device_phase::collective, c.step);
  return header_options;
}

void step_runner::absorb_header(const collective& comm) {
  const auto members = static_cast<std::size_t>(comm.size());
  for (std::size_t r = 0; r < members; ++r)
    if (header_[h_members + 2 * members + r] == 0.0f && header_[h_members + members + r] > 0.0f)
      compute_times_.push(header_[h_members + r]);
}

std::span<const float> step_runner::synchronize(const computed& c, std::size_t returned, replica& model,
                                                collective& comm, const collective_options& options,
                                                late_observer* observer, const lr_schedule& schedule) {
  device_progress& progress = *c.progress;
  const std::span<float> grads = model.gradients();
  if (!c.sliced && comm.rank() != 0) clear_buffers(model, grads);  // See Note [Module buffers]: rank 0's count
  whole_ = {0, grads.size(), 0};  // the gradients as one part
  lr_ = c.lr_override > 0.0 ? c.lr_override : schedule.at(c.schedule_position);
  // See Note [Non-finite steps]: the count travels in the header.
  if (!faults_.empty() && find_fault(fault_kind::nan, c.step + 1)) poison_gradients(c, model);
  nonfinite_local_ = count_nonfinite_gradients(c, model);
  applied_ = true;
  if (c.sliced && !keeps_leaves() && comm.size() > 1 && (comm.gathers_gradients() || gather_gradients_))
    return synchronize_in_one_call(c, model, comm, options, observer, progress);
  if (compresses(c.step)) {
    // See Note [PowerSGD steps]: the header travels with the first message
    // (one call fewer a step), and a step not finite sends nothing more.
    const collective_options header_options = fill_header(c, returned, comm, options, observer, progress);
    const bool proceeded = c.sliced ? exchange_powersgd(c, model, grads, comm, header_options, options)
                                    : exchange_powersgd_members(model, grads, comm, header_options, options);
    if (!proceeded) return c.sliced ? skip(model, c) : skip(model);
    return update(model, comm, options, lr_, {&whole_, 1}, c.step, progress, /*reduced_whole=*/true);
  }
  if (c.sliced) {
    // See Note [Summation tree]: the nodes this member holds go into the
    // tree's reduce-scatter; its chunk of the root lands in `grads`.
    reduce_header(c, 0, comm, options, observer, progress);
    if (!header_is_finite()) return skip(model, c);
    // See Note [Fragments]: the step's fragment, or all of it.
    const auto f = static_cast<std::size_t>(c.step % fragments_);
    const auto [fb, fe] = fragment_range(grads.size(), static_cast<std::size_t>(fragments_), f);
    fragment_ = {fb, fe, 0};
    // See Note [Delayed rounds]: the run's last round applies the held one too.
    if (c.work != nullptr && c.work->flushes(c.step)) model.flush_next_update();
    if (int8_ || bf16_) {
      if (int8_) exchange_int8(c, fb, fe, grads, comm, options);
      else exchange_bf16(c, fb, fe, grads, comm, options);
      return update(model, comm, options, lr_, {&fragment_, 1}, c.step, progress, /*reduced_whole=*/true);
    }
    parts_.clear();
    for (const auto& [node, buffer] : builder_.held()) parts_.push_back({node, buffers_[buffer].subspan(fb, fe - fb)});
    comm.reduce_scatter_tree(tree_->slices(), parts_, grads.subspan(fb, fe - fb), options);
    return update(model, comm, options, lr_, {&fragment_, 1}, c.step, progress);
  }
  // See Note [Sharded optimizer step], and Note [Gradient buckets] for a
  // backend that overlaps: its buckets not started during backward start now,
  // in order, and the header follows them on every member. Otherwise the
  // gradients are one part, reduced after the header.
  std::span<const gradient_bucket> parts;
  if (bf16_) {  // See Note [Bf16 steps]: compute() started no bucket
    reduce_header(c, returned, comm, options, observer, progress);
    if (!header_is_finite()) return skip(model);
    exchange_bf16_members(grads, comm, options);
    return update(model, comm, options, lr_, {&whole_, 1}, c.step, progress, /*reduced_whole=*/true);
  }
  if (comm.overlaps_compute()) {
    if (c.overlapped != &comm) starter_.begin_step(buckets(model), &comm, model.native_stream());
    starter_.finish(grads);
    reduce_header(c, returned, comm, options, observer, progress);
    if (!header_is_finite()) return skip(model);
    parts = buckets(model);
  } else if (comm.size() > 1 && (comm.gathers_gradients() || gather_gradients_)) {
    // See Note [One call a step]: the header and the gradients' all-reduce
    // (what the reduce-scatter and the gather below make) in one call.
    const collective_options header_options = fill_header(c, returned, comm, options, observer, progress);
    const bool proceeded = comm.all_reduce_with_header(
        grads, header_, [this](std::span<const float>) { return header_is_finite(); }, header_options, options);
    absorb_header(comm);
    if (!proceeded) return skip(model);
    return update(model, comm, options, lr_, {&whole_, 1}, c.step, progress, /*reduced_whole=*/true);
  } else {
    reduce_header(c, returned, comm, options, observer, progress);
    if (!header_is_finite()) return skip(model);
    comm.reduce_scatter_sum(grads, options);
    parts = {&whole_, 1};
  }
  return update(model, comm, options, lr_, parts, c.step, progress);
}

void step_runner::preview_update(const computed& c, replica& shadow, const lr_schedule& schedule) {
  // As synchronize(): the rate, the step's fragment, then update()'s branch
  // for a member that holds the whole reduced gradient. The gradient (zeros
  // here) only reaches the pending slot; any positive weight does.
  const double lr = c.lr_override > 0.0 ? c.lr_override : schedule.at(c.schedule_position);
  const std::span<float> grads = shadow.gradients();
  std::fill(grads.begin(), grads.end(), 0.0f);
  const auto f = static_cast<std::size_t>(c.step % fragments_);
  const auto [fb, fe] = fragment_range(grads.size(), static_cast<std::size_t>(fragments_), f);
  const gradient_bucket part{fb, fe, 0};
  if (fe - fb == shadow.layout().parameter_size) {
    shadow.update_in_place(lr, 1.0);
    return;
  }
  shadow.apply_update(lr, 1.0, fb, fe);
  carry_gaps(shadow, {&part, 1}, lr);
  shadow.finish_step();
}

// See Note [One call a step]: what the sliced branch of synchronize() does
// where every member gathers the reduced gradients, the header, the tree and
// the gather in one call; the whole reduced fragment lands in `grads`.
std::span<const float> step_runner::synchronize_in_one_call(const computed& c, replica& model, collective& comm,
                                                            const collective_options& options,
                                                            late_observer* observer, device_progress& progress) {
  const std::span<float> grads = model.gradients();
  const collective_options header_options = fill_header(c, 0, comm, options, observer, progress);
  const auto f = static_cast<std::size_t>(c.step % fragments_);
  const auto [fb, fe] = fragment_range(grads.size(), static_cast<std::size_t>(fragments_), f);
  fragment_ = {fb, fe, 0};
  parts_.clear();
  for (const auto& [node, buffer] : builder_.held()) parts_.push_back({node, buffers_[buffer].subspan(fb, fe - fb)});
  const bool proceeded = comm.all_reduce_tree(tree_->slices(), parts_, grads.subspan(fb, fe - fb), header_,
                                              [this](std::span<const float>) { return header_is_finite(); },
                                              header_options, options);
  absorb_header(comm);
  if (!proceeded) return skip(model, c);
  // See Note [Delayed rounds]: the run's last round applies the held one too.
  if (c.work != nullptr && c.work->flushes(c.step)) model.flush_next_update();
  return update(model, comm, options, lr_, {&fragment_, 1}, c.step, progress, /*reduced_whole=*/true);
}

// See Note [Int8 pseudo-gradients]. Every worker's block maxima reach every
// member (each row non-zero on the member that ran the worker: the float sum
// is exact), every member plans the same scales and limits, each quantizes
// its workers' values into one int8 sum, handing the residuals back, and the
// int8 sums are all-reduced.
void step_runner::exchange_int8(const computed& c, std::size_t begin, std::size_t end, std::span<float> grads,
                                collective& comm, const collective_options& options) {
  const std::size_t workers = tree_->slices(), n = end - begin, blocks = int8_blocks(n);
  maxima_.assign(workers * blocks, 0.0f);
  for (const auto& [slice, buffer] : leaves_)
    block_maxima(buffers_[buffer].subspan(begin, n), std::span<float>(maxima_).subspan(slice * blocks, blocks));
  if (comm.size() > 1) comm.all_reduce_sum(maxima_, options);
  if (c.work != nullptr) c.work->keep_maxima(c.step, maxima_);
  int8_plan_.build(maxima_, workers);
  int8_sum_.assign(n, 0);
  for (const auto& [slice, buffer] : leaves_) {
    int8_plan_.encode(slice, buffers_[buffer].subspan(begin, n), int8_sum_);
    if (c.work != nullptr) c.work->keep_residual(c.step, slice, buffers_[buffer]);
  }
  if (comm.size() > 1) comm.all_reduce_sum_int8(int8_sum_, options);
  int8_plan_.decode(int8_sum_, grads.subspan(begin, n));
}

// See Note [Bf16 pseudo-gradients].
void step_runner::exchange_bf16(const computed& c, std::size_t begin, std::size_t end, std::span<float> grads,
                                collective& comm, const collective_options& options) {
  const std::size_t n = end - begin;
  leaves_bf16_.resize(leaves_.size());
  parts_bf16_.clear();
  for (std::size_t l = 0; l < leaves_.size(); ++l) {
    const auto [slice, buffer] = leaves_[l];
    const std::span<float> v = buffers_[buffer].subspan(begin, n);
    auto& rounded = leaves_bf16_[l];
    rounded.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      rounded[i] = to_bf16(v[i]);
      v[i] -= from_bf16(rounded[i]);  // the residual: exact
    }
    if (c.work != nullptr) c.work->keep_residual(c.step, slice, buffers_[buffer]);
    parts_bf16_.push_back({tree_->leaf(slice), rounded});
  }
  const std::span<float> sum = grads.subspan(begin, n);
  comm.reduce_scatter_tree_bf16(tree_->slices(), parts_bf16_, sum, options);
  gather_bf16_sum(sum, comm, options);
}

// See Note [Bf16 steps].
void step_runner::exchange_bf16_members(std::span<float> grads, collective& comm, const collective_options& options) {
  const auto members = static_cast<std::size_t>(comm.size());
  const summation_tree tree(members);
  leaves_bf16_.resize(1);
  auto& rounded = leaves_bf16_[0];
  rounded.resize(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) rounded[i] = to_bf16(grads[i]);
  parts_bf16_.assign(1, {tree.leaf(static_cast<std::size_t>(comm.rank())), rounded});
  comm.reduce_scatter_tree_bf16(members, parts_bf16_, grads, options);
  gather_bf16_sum(grads, comm, options);
}

const powersgd_plan& step_runner::powersgd_plan_of(const replica& model) {
  if (!powersgd_plan_) powersgd_plan_.emplace(model.layout(), powersgd_->rank);
  return *powersgd_plan_;
}

void step_runner::gather_sum(std::span<float> sum, collective& comm, const collective_options& options) {
  if (comm.size() > 1) comm.all_gather({&sum, 1}, options);
}

// See Note [PowerSGD steps]: the held slices' messages are leaves of the
// summation tree, each sum gathered whole on every member. A slice's
// residual is written before the second exchange (it needs P and the
// slice's own Q only), so that a member that finishes the step has every
// slice's residual to read in the next one.
bool step_runner::exchange_powersgd(const computed& c, const replica& model, std::span<float> grads, collective& comm,
                                    const collective_options& header_options, const collective_options& options) {
  const powersgd_plan& plan = powersgd_plan_of(model);
  const std::vector<float> basis = powersgd_->bases->read(0, c.step);
  const std::size_t held = leaves_.size();
  p_parts_.resize(held);
  q_parts_.resize(held);
  parts_.clear();
  for (std::size_t l = 0; l < held; ++l) {
    const auto [slice, buffer] = leaves_[l];
    p_parts_[l].resize(plan.p_floats());
    plan.project(buffers_[buffer], basis, p_parts_[l]);
    parts_.push_back({tree_->leaf(slice), p_parts_[l]});
  }
  p_sum_.assign(plan.p_floats(), 0.0f);
  const bool proceeded = comm.all_reduce_tree(tree_->slices(), parts_, p_sum_, header_,
                                              [this](std::span<const float>) { return header_is_finite(); },
                                              header_options, options);
  absorb_header(comm);
  if (!proceeded) return false;
  plan.orthogonalize(p_sum_);
  parts_.clear();
  for (std::size_t l = 0; l < held; ++l) {
    const auto [slice, buffer] = leaves_[l];
    q_parts_[l].resize(plan.q_floats());
    plan.back_project(buffers_[buffer], p_sum_, q_parts_[l]);
    plan.keep_residual(buffers_[buffer], p_sum_, q_parts_[l]);
    powersgd_->residuals->write(slice, c.step, std::vector<float>(buffers_[buffer].begin(), buffers_[buffer].end()));
    parts_.push_back({tree_->leaf(slice), q_parts_[l]});
  }
  q_sum_.assign(plan.q_floats(), 0.0f);
  comm.reduce_scatter_tree(tree_->slices(), parts_, q_sum_, options);
  gather_sum(q_sum_, comm, options);
  plan.decompress(p_sum_, q_sum_, grads);
  powersgd_->bases->write(0, c.step, q_sum_);  // the warm start: every member writes the same bytes
  return true;
}

// See Note [PowerSGD steps]: fast mode, this member one unit; its residual
// and basis are its own (the sums are the all-reduce's, so the members
// apply the same bytes even where their bases differ, as a newcomer's does).
// The residual changes only once both exchanges are done: a step that fails
// keeps the one it started from.
bool step_runner::exchange_powersgd_members(const replica& model, std::span<float> grads, collective& comm,
                                            const collective_options& header_options,
                                            const collective_options& options) {
  const powersgd_plan& plan = powersgd_plan_of(model);
  if (member_basis_.empty()) member_basis_ = plan.initial_basis(powersgd_->seed);
  member_residual_.resize(plan.parameters(), 0.0f);
  const std::span<float> m = grads.first(plan.parameters());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] += member_residual_[i];
  p_sum_.assign(plan.p_floats(), 0.0f);
  plan.project(m, member_basis_, p_sum_);
  const bool proceeded = comm.all_reduce_with_header(
      p_sum_, header_, [this](std::span<const float>) { return header_is_finite(); }, header_options, options);
  absorb_header(comm);
  if (!proceeded) return false;
  plan.orthogonalize(p_sum_);
  q_parts_.resize(1);
  q_parts_[0].assign(plan.q_floats(), 0.0f);
  plan.back_project(m, p_sum_, q_parts_[0]);
  q_sum_ = q_parts_[0];
  if (comm.size() > 1) comm.all_reduce_sum(q_sum_, options);
  std::copy(m.begin(), m.end(), member_residual_.begin());
  plan.keep_residual(member_residual_, p_sum_, q_parts_[0]);
  plan.decompress(p_sum_, q_sum_, m);
  member_basis_ = q_sum_;
  return true;
}

void step_runner::gather_bf16_sum(std::span<float> sum, collective& comm, const collective_options& options) {
  const std::size_t n = sum.size();
  const auto [cb, ce] = comm.size() > 1 ? comm.chunk(n, comm.rank()) : std::pair<std::size_t, std::size_t>{0, n};
  gathered_bf16_.resize(n);
  for (std::size_t i = cb; i < ce; ++i) gathered_bf16_[i] = to_bf16(sum[i]);
  if (comm.size() > 1) comm.all_gather_bf16(gathered_bf16_, options);
  for (std::size_t i = 0; i < n; ++i) sum[i] = from_bf16(gathered_bf16_[i]);
}

void step_runner::carry_gaps(replica& model, std::span<const gradient_bucket> parts, double lr) {
  std::size_t at = 0;
  for (const gradient_bucket& b : parts) {
    if (b.begin > at) model.apply_update(lr, 0.0, at, b.begin);  // no samples: the state carries over
    at = std::max(at, b.end);
  }
  if (const std::size_t size = model.layout().parameter_size; at < size) model.apply_update(lr, 0.0, at, size);
}

std::span<const float> step_runner::skip(replica& model) {
  applied_ = false;
  if (nonfinite_ == nonfinite_policy::skip) model.skip_step();
  return header_;
}

std::span<const float> step_runner::skip(replica& model, const computed& c) {
  if (c.work != nullptr)
    for (const std::uint32_t slice : computed_slices_) c.work->discard(c.step, slice);
  return skip(model);
}

std::span<const float> step_runner::update(replica& model, collective& comm, const collective_options& options,
                                           double lr, std::span<const gradient_bucket> parts, std::int64_t step,
                                           device_progress& progress, bool reduced_whole) {
  progress.mark(device_phase::optimizer, step);
  // A member alone gathers nothing, so no collective can fail after its
  // update: it updates in place (See replica::update_in_place). Nor does a
  // member that holds the whole reduced gradient.
  // The parts cover the parameter section (buckets, or the whole), or leave
  // gaps where the state carries over (a fragment, See Note [Fragments]).
  std::size_t covered = 0;
  for (const gradient_bucket& b : parts) covered += b.size();
  const bool whole = covered == model.layout().parameter_size;
  if (comm.size() == 1 || reduced_whole) {
    if (whole) {
      model.update_in_place(lr, header_[h_weight]);
      return header_;
    }
    for (const gradient_bucket& b : parts) model.apply_update(lr, header_[h_weight], b.begin, b.end);
    carry_gaps(model, parts, lr);
    model.finish_step();
    return header_;
  }
  if (comm.gathers_gradients() || gather_gradients_) {
    // Every member gets the whole reduced gradient and updates everything.
    progress.mark(device_phase::collective, step);
    gather_parts_.clear();
    const std::span<float> grads = model.gradients();
    for (const gradient_bucket& b : parts) gather_parts_.push_back(grads.subspan(b.begin, b.size()));
    comm.all_gather(gather_parts_, options);
    progress.mark(device_phase::optimizer, step);
    for (const gradient_bucket& b : parts) model.apply_update(lr, header_[h_weight], b.begin, b.begin + b.size());
    if (!whole) carry_gaps(model, parts, lr);
    model.finish_step();
    return header_;
  }
  for (const gradient_bucket& b : parts) {
    const auto [begin, end] = comm.chunk(b.size(), comm.rank());
    model.apply_update(lr, header_[h_weight], b.begin + begin, b.begin + end);
  }
  progress.mark(device_phase::collective, step);
  gather_parts_.clear();  // keeps its capacity
  for (const std::span<float> section : model.state_sections())
    for (const gradient_bucket& b : parts) gather_parts_.push_back(section.subspan(b.begin, b.size()));
  comm.all_gather(gather_parts_, options);
  model.finish_step();
  return header_;
}

}  // namespace dpactor
