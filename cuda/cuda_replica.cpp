#include "cuda/cuda_replica.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "cuda/kernels.hpp"

namespace dpactor {
namespace {

activation layer_activation(const mlp_spec& spec, std::size_t layer) {
  return layer + 1 == spec.layers() ? activation::identity : spec.hidden_activation;
}

}  // namespace

cuda_replica::cuda_replica(mlp_spec spec, optimizer_config opt, std::size_t micro_batch, cuda_replica_options options)
    : selected_(options.device),
      spec_(std::move(spec)),
      opt_(opt),
      layout_(make_state_layout(spec_, opt_)),
      params_(mlp_layout(spec_)),
      micro_batch_(micro_batch),
      options_(options),

      blas_(stream_.get(), options.tf32) {
  device_guard guard(options_.device);
  grads_ = device_buffer<float>(layout_.parameter_size);
  CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.size() * sizeof(float), stream_.get()));
  for (int b = 0; b < 2; ++b) {
    states_[b] = device_buffer<float>(layout_.total_size());
    CUDA_CHECK(cudaMemsetAsync(states_[b].data(), 0, states_[b].size() * sizeof(float), stream_.get()));
    for (std::size_t s = 0; s <= layout_.slots.size(); ++s)
      sections_[b].emplace_back(states_[b].data() + s * layout_.parameter_size, layout_.parameter_size);
  }
  std::size_t widest = 0;
  for (std::size_t l = 0; l < spec_.layers(); ++l) {
    const auto out = static_cast<std::size_t>(spec_.sizes[l + 1]);
    widest = std::max(widest, out);
    outputs_.emplace_back(micro_batch_ * out);
    inputs_.emplace_back(activation_backward_needs_input(layer_activation(spec_, l)) ? micro_batch_ * out : 0);
  }
  grad_a_ = device_buffer<float>(micro_batch_ * widest);
  grad_b_ = device_buffer<float>(micro_batch_ * widest);
  x_ = device_buffer<float>(micro_batch_ * static_cast<std::size_t>(spec_.inputs()));
  y_ = device_buffer<std::int32_t>(micro_batch_);
  host_indices_ = pinned_buffer<std::uint32_t>(micro_batch_);
  indices_ = device_buffer<std::uint32_t>(micro_batch_);
  host_small_ = pinned_buffer<small_values>(1);
  loss_sum_ = device_buffer<double>(1);
  correct_ = device_buffer<unsigned long long>(1);
  nonfinite_ = device_buffer<unsigned long long>(1);
  sync(stream_.get());
}

cuda_replica::~cuda_replica() = default;

void cuda_replica::sync(cudaStream_t stream) const {
  cuda_event done;
  done.record(stream);
  wait_for_event(done, std::chrono::steady_clock::now() + options_.wait_limit);
}

const cuda_replica::device_dataset& cuda_replica::on_device(const batch_ref& rows) {
  auto it = datasets_.find(rows.features);
  if (it != datasets_.end()) return it->second;
  if (rows.rows == 0) throw std::invalid_argument("cuda_replica: batch_ref without a row count");
  device_dataset d{device_buffer<float>(rows.rows * rows.feature_count), device_buffer<std::int32_t>(rows.rows)};
  CUDA_CHECK(cudaMemcpyAsync(d.features.data(), rows.features, d.features.size() * sizeof(float),
                             cudaMemcpyHostToDevice, stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(d.labels.data(), rows.labels, d.labels.size() * sizeof(std::int32_t),
                             cudaMemcpyHostToDevice, stream_.get()));
  sync(stream_.get());
  return datasets_.emplace(rows.features, std::move(d)).first->second;
}

bool cuda_replica::resident(const batch_ref& rows) {
  const auto it = resident_.find(rows.features);
  if (it != resident_.end()) return it->second;
  bool fits = options_.data == cuda_data_placement::resident;
  if (options_.data == cuda_data_placement::automatic) {
    std::size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    fits = rows.rows * (rows.feature_count * sizeof(float) + sizeof(std::int32_t)) <= free / 2;
  }
  return resident_.emplace(rows.features, fits).first->second;
}

cuda_replica::staging_slot& cuda_replica::stage(const batch_ref& rows) {
  const std::size_t n = rows.indices.size();
  const std::size_t features = rows.feature_count;
  staging_slot& s = slots_[next_slot_];
  next_slot_ = 1 - next_slot_;
  if (s.features.size() < micro_batch_ * features) {  // first use, or wider rows
    if (s.used) wait_for_event(s.copied, std::chrono::steady_clock::now() + options_.wait_limit);
    s.features = pinned_buffer<float>(micro_batch_ * features);
    s.labels = pinned_buffer<std::int32_t>(micro_batch_);
    s.device_features = device_buffer<float>(micro_batch_ * features);
    s.device_labels = device_buffer<std::int32_t>(micro_batch_);
    s.used = false;
  }
  // The pinned rows of the slot's last use may still be on their way.
  if (s.used) wait_for_event(s.copied, std::chrono::steady_clock::now() + options_.wait_limit);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t row = rows.indices[i];
    std::memcpy(s.features.data() + i * features, rows.features + static_cast<std::size_t>(row) * features,
                features * sizeof(float));
    s.labels[i] = rows.labels[row];
  }
  // The device copy must not overwrite rows that a pass still reads.
  if (s.used) CUDA_CHECK(cudaStreamWaitEvent(copy_stream_.get(), s.consumed.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(s.device_features.data(), s.features.data(), n * features * sizeof(float),
                             cudaMemcpyHostToDevice, copy_stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(s.device_labels.data(), s.labels.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                             copy_stream_.get()));
  s.copied.record(copy_stream_.get());
  s.used = true;
  s.ticket = 0;
  return s;
}

cuda_replica::staging_slot* cuda_replica::claim(const batch_ref& rows) {
  const std::size_t n = rows.indices.size();
  for (staging_slot& s : slots_)
    if (s.ticket != 0 && s.features_of == rows.features && s.indices == rows.indices.data() && s.n == n &&
        s.first == rows.indices.front() && s.last == rows.indices.back()) {
      // Older prefetches were skipped (a cut step): they are not claimed later.
      for (staging_slot& other : slots_)
        if (other.ticket < s.ticket) other.ticket = 0;
      s.ticket = 0;
      return &s;
    }
  return nullptr;
}

void cuda_replica::prefetch(const batch_ref& rows) {
  const std::size_t n = rows.indices.size();
  if (n == 0 || n > micro_batch_) return;
  device_guard guard(options_.device);
  if (resident(rows)) return;
  staging_slot& s = stage(rows);
  s.ticket = ++tickets_;
  s.features_of = rows.features;
  s.indices = rows.indices.data();
  s.n = n;
  s.first = rows.indices.front();
  s.last = rows.indices.back();
}

void cuda_replica::release_input() {
  if (input_slot_ != nullptr) input_slot_->consumed.record(stream_.get());
  input_slot_ = nullptr;
}

std::size_t cuda_replica::gather(const batch_ref& rows) {
  const std::size_t n = rows.indices.size();
  if (n > micro_batch_) throw std::invalid_argument("cuda_replica: more rows than the micro-batch");
  if (n == 0) return 0;
  if (!resident(rows)) {
    staging_slot* s = claim(rows);
    if (s == nullptr) s = &stage(rows);
    CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), s->copied.get(), 0));
    input_slot_ = s;
    input_ = s->device_features.data();
    labels_ = s->device_labels.data();
    return n;
  }
  const device_dataset& d = on_device(rows);
  // The pinned staging buffer is reused: the previous copy must be done.
  sync(stream_.get());
  std::memcpy(host_indices_.data(), rows.indices.data(), n * sizeof(std::uint32_t));
  CUDA_CHECK(cudaMemcpyAsync(indices_.data(), host_indices_.data(), n * sizeof(std::uint32_t), cudaMemcpyHostToDevice,
                             stream_.get()));
  cuda::gather_rows(d.features.data(), d.labels.data(), indices_.data(), n, rows.feature_count, x_.data(), y_.data(),
                    stream_.get());
  input_ = x_.data();
  labels_ = y_.data();
  return n;
}

const float* cuda_replica::forward(std::size_t n) {
  const float* in = input_;
  for (std::size_t l = 0; l < spec_.layers(); ++l) {
    const int fan_in = spec_.sizes[l], fan_out = spec_.sizes[l + 1];
    const float* w = state().data() + params_.tensors()[2 * l].offset;  // (out, in)
    const float* b = state().data() + params_.tensors()[2 * l + 1].offset;
    float* a = outputs_[l].data();
    float* z = inputs_[l].size() == 0 ? a : inputs_[l].data();
    // (n, in) x (in, out) -> (n, out): z = x W^T
    gemm(blas_, false, true, static_cast<int>(n), fan_out, fan_in, 1.0f, in, fan_in, w, fan_in, 0.0f, z, fan_out);
    cuda::bias_activation_forward(layer_activation(spec_, l), n, static_cast<std::size_t>(fan_out), b, z, a, stream_.get());
    in = a;
  }
  return in;
}

// Small reads and writes go through pinned memory: a copy to or from pageable
// memory would block the thread until the stream gets there, with no deadline.
batch_stats cuda_replica::read_stats(std::size_t n) {
  CUDA_CHECK(cudaMemcpyAsync(&host_small_.data()->loss, loss_sum_.data(), sizeof(double), cudaMemcpyDeviceToHost,
                             stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(&host_small_.data()->correct, correct_.data(), sizeof(unsigned long long),
                             cudaMemcpyDeviceToHost, stream_.get()));
  sync(stream_.get());
  return {host_small_.data()->loss, static_cast<std::int64_t>(host_small_.data()->correct), static_cast<std::int64_t>(n)};
}

void cuda_replica::zero_grad() {
  for (staging_slot& s : slots_) s.ticket = 0;  // a new step: earlier prefetches are not claimed
  grads_written_ = false;  // the first micro-batch writes the gradients
  samples_ = 0.0;
}

std::span<float> cuda_replica::gradients() {
  device_guard guard(options_.device);
  if (!grads_written_) {
    CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.size() * sizeof(float), stream_.get()));
    grads_written_ = true;
  }
  sync(stream_.get());  // the collective runs on another stream
  return grads_.span();
}

std::int64_t cuda_replica::count_nonfinite_gradients() {
  return count_nonfinite_in(gradients());  // written, and the stream synchronized
}

const float* cuda_replica::begin_pass(const batch_ref& rows, std::size_t& n) {
  n = gather(rows);
  if (n == 0) return nullptr;
  CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, sizeof(double), stream_.get()));
  CUDA_CHECK(cudaMemsetAsync(correct_.data(), 0, sizeof(unsigned long long), stream_.get()));
  return forward(n);
}

batch_stats cuda_replica::accumulate(const batch_ref& rows, gradient_listener* listener) {
  device_guard guard(options_.device);
  const input_release release{*this};
  std::size_t n = 0;
  const float* out = begin_pass(rows, n);
  if (n == 0) return {};
  backward(n, out, grads_.data(), !grads_written_, listener);
  grads_written_ = true;
  samples_ += static_cast<double>(n);
  return read_stats(n);
}

// A slice's gradients stand alone: written, never added to. Rows of no slice
// (an empty one) leave zeros. read_stats() waits for the stream, so the
// buffer is complete on return.
batch_stats cuda_replica::accumulate_slice(const batch_ref& rows, std::span<float> grads) {
  if (grads.size() != layout_.parameter_size)
    throw std::invalid_argument("cuda_replica: a slice's gradient buffer of " + std::to_string(grads.size()) +
                                " floats, the parameters have " + std::to_string(layout_.parameter_size));
  device_guard guard(options_.device);
  const input_release release{*this};
  std::size_t n = 0;
  const float* out = begin_pass(rows, n);
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(grads.data(), 0, grads.size_bytes(), stream_.get()));
    sync(stream_.get());
    return {};
  }
  backward(n, out, grads.data(), /*overwrite=*/true, nullptr);
  if (grads.data() == grads_.data()) grads_written_ = true;
  return read_stats(n);
}

// Kept for the run: a step's tree holds at most about log2(slices) of them.
std::span<float> cuda_replica::scratch_gradients(std::size_t i) {
  device_guard guard(options_.device);
  while (scratch_.size() <= i) scratch_.emplace_back(layout_.parameter_size);
  return scratch_[i].span();
}

void cuda_replica::add_gradients(std::span<float> into, std::span<const float> from) {
  if (into.size() != from.size()) throw std::invalid_argument("add_gradients: buffers of different sizes");
  device_guard guard(options_.device);
  cuda::add_into(into.data(), from.data(), into.size(), stream_.get());
  sync(stream_.get());  // the collective reads the buffers on its own stream
}

std::int64_t cuda_replica::count_nonfinite_in(std::span<const float> values) {
  device_guard guard(options_.device);
  CUDA_CHECK(cudaMemsetAsync(nonfinite_.data(), 0, sizeof(unsigned long long), stream_.get()));
  cuda::count_nonfinite(values.data(), values.size(), nonfinite_.data(), stream_.get());
  CUDA_CHECK(cudaMemcpyAsync(&host_small_.data()->nonfinite, nonfinite_.data(), sizeof(unsigned long long),
                             cudaMemcpyDeviceToHost, stream_.get()));
  sync(stream_.get());
  return static_cast<std::int64_t>(host_small_.data()->nonfinite);
}

void cuda_replica::backward(std::size_t n, const float* out, float* grads, bool overwrite, gradient_listener* listener) {
  const auto classes = static_cast<std::size_t>(spec_.outputs());
  float* d = grad_a_.data();
  float* d_next = grad_b_.data();
  cuda::loss(spec_.loss, n, classes, out, labels_, d, loss_sum_.data(), correct_.data(), stream_.get());
  const float beta = overwrite ? 0.0f : 1.0f;
  const std::span<float> all(grads, layout_.parameter_size);
  for (std::size_t l = spec_.layers(); l-- > 0;) {
    const int fan_in = spec_.sizes[l], fan_out = spec_.sizes[l + 1];
    const activation act = layer_activation(spec_, l);
    const float* saved = activation_backward_needs_input(act) ? inputs_[l].data() : outputs_[l].data();
    float* bias_grad = grads + params_.tensors()[2 * l + 1].offset;
    cuda::bias_activation_backward(act, n, static_cast<std::size_t>(fan_out), saved, d, bias_grad, overwrite, stream_.get());
    const float* in = l == 0 ? input_ : outputs_[l - 1].data();
    // (out, n) x (n, in) -> (out, in): dW = dZ^T X
    gemm(blas_, true, false, fan_out, fan_in, static_cast<int>(n), 1.0f, d, fan_out, in, fan_in, beta,
         grads + params_.tensors()[2 * l].offset, fan_in);
    // The layer's gradients are enqueued: its bucket may start reducing on
    // the communication stream while the layers below compute.
    if (listener != nullptr) listener->on_gradients_ready(all, 2 * l);
    if (l > 0) {
      // (n, out) x (out, in) -> (n, in)
      gemm(blas_, false, false, static_cast<int>(n), fan_in, fan_out, 1.0f, d, fan_out,
           state().data() + params_.tensors()[2 * l].offset, fan_in, 0.0f, d_next, fan_in);
      std::swap(d, d_next);
    }
  }
}

batch_stats cuda_replica::evaluate(const batch_ref& rows) {
  device_guard guard(options_.device);
  const input_release release{*this};
  std::size_t n = 0;
  const float* out = begin_pass(rows, n);
  if (n == 0) return {};
  cuda::loss(spec_.loss, n, static_cast<std::size_t>(spec_.outputs()), out, labels_, nullptr, loss_sum_.data(),
             correct_.data(), stream_.get());
  return read_stats(n);
}

void cuda_replica::apply_update(double lr, double total_samples, std::size_t begin, std::size_t end) {
  write_update(lr, total_samples, begin, end, sections_[1 - current_]);
}

void cuda_replica::update_in_place(double lr, double total_samples) {
  if (total_samples > 0.0) write_update(lr, total_samples, 0, layout_.parameter_size, sections_[current_]);
  ++steps_;
}

void cuda_replica::write_update(double lr, double total_samples, std::size_t begin, std::size_t end,
                                const std::vector<std::span<float>>& to) {
  if (end <= begin) return;
  device_guard guard(options_.device);
  const auto& from = sections_[current_];
  const std::size_t n = end - begin;
  if (total_samples <= 0.0) {  // no samples anywhere: the state carries over
    for (std::size_t s = 0; s < from.size(); ++s)
      CUDA_CHECK(cudaMemcpyAsync(to[s].data() + begin, from[s].data() + begin, n * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_.get()));
  } else {
    cuda::optimizer_buffers b{from[0].data() + begin, to[0].data() + begin, grads_.data() + begin};
    if (from.size() > 1) {
      b.slot0_in = from[1].data() + begin;
      b.slot0_out = to[1].data() + begin;
    }
    if (from.size() > 2) {
      b.slot1_in = from[2].data() + begin;
      b.slot1_out = to[2].data() + begin;
    }
    cuda::optimizer_step(opt_, b, n, static_cast<float>(1.0 / total_samples), lr, steps_, stream_.get());
  }
  sync(stream_.get());  // the all-gather runs on another stream
}

// See Note [Pending state]. The step counter lives on the host; it goes into
// the state's tail when the state leaves the device.
void cuda_replica::finish_step() {
  current_ = 1 - current_;
  ++steps_;
}

std::span<float> cuda_replica::state_buffer() {
  device_guard guard(options_.device);
  host_small_.data()->steps = steps_;
  CUDA_CHECK(cudaMemcpyAsync(state().data() + layout_.layout.size(), &host_small_.data()->steps, sizeof steps_,
                             cudaMemcpyHostToDevice, stream_.get()));
  sync(stream_.get());
  return state().span();
}

// A broadcast overwrote the current state, its tail included, where the
// state source had written its step counter (state_buffer()).
void cuda_replica::on_state_replaced() {
  device_guard guard(options_.device);
  // The step counter came with the broadcast, in the state's tail.
  CUDA_CHECK(cudaMemcpyAsync(&host_small_.data()->steps, state().data() + layout_.layout.size(), sizeof(std::int64_t),
                             cudaMemcpyDeviceToHost, stream_.get()));
  sync(stream_.get());
  steps_ = host_small_.data()->steps;
}

// Whole-state copies also go through pinned memory (allocated on first use)
// and poll: a copy to pageable memory would wait for the stream without a
// deadline.
float* cuda_replica::staging() const {
  if (staging_.size() < state().size()) staging_ = pinned_buffer<float>(state().size());
  return staging_.data();
}

void cuda_replica::download(float* out, const float* from, std::size_t n) const {
  float* stage = staging();
  CUDA_CHECK(cudaMemcpyAsync(stage, from, n * sizeof(float), cudaMemcpyDeviceToHost, stream_.get()));
  sync(stream_.get());
  std::memcpy(out, stage, n * sizeof(float));
}

std::vector<float> cuda_replica::export_state() const {
  device_guard guard(options_.device);
  std::vector<float> out(state().size());
  download(out.data(), state().data(), out.size());
  write_step_counter(out, layout_, steps_);
  return out;
}

void cuda_replica::import_state(std::span<const float> state) {
  if (state.size() != this->state().size())
    throw std::invalid_argument("state has " + std::to_string(state.size()) + " floats, the replica " +
                                std::to_string(this->state().size()));
  device_guard guard(options_.device);
  float* stage = staging();
  std::memcpy(stage, state.data(), state.size() * sizeof(float));
  CUDA_CHECK(cudaMemcpyAsync(this->state().data(), stage, state.size() * sizeof(float), cudaMemcpyHostToDevice,
                             stream_.get()));
  sync(stream_.get());
  steps_ = read_step_counter(state, layout_);
}

void cuda_replica::copy_parameters(std::span<float> out) const {
  device_guard guard(options_.device);
  download(out.data(), state().data(), layout_.parameter_size);
}

std::uint64_t cuda_replica::state_checksum() const {
  const std::vector<float> state = export_state();
  return checksum_floats(std::span<const float>(state).first(layout_.layout.size() + 2));
}

}  // namespace dpactor
