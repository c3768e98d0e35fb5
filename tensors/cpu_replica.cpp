#include "tensors/cpu_replica.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <stdexcept>

namespace dpactor {

cpu_replica::cpu_replica(mlp_spec spec, optimizer_config opt, std::size_t micro_batch)
    : cpu_replica(std::make_unique<mlp>(std::move(spec), micro_batch), opt) {}

cpu_replica::cpu_replica(std::unique_ptr<compute_model> model, optimizer_config opt)
    : opt_(opt),
      layout_(make_state_layout(model->layout(), opt, model->buffer_begin())),
      model_(std::move(model)),
      states_{aligned_buffer<float>(layout_.total_size()), aligned_buffer<float>(layout_.total_size())},
      grads_(layout_.parameter_size),
      x_(model_->max_batch() * model_->inputs()),
      y_(model_->max_batch()) {
  for (int b = 0; b < 2; ++b)
    for (std::size_t s = 0; s <= layout_.slots.size(); ++s)
      sections_[b].emplace_back(states_[b].data() + s * layout_.parameter_size, layout_.parameter_size);
}

// Zeroing is deferred: the step's first micro-batch writes the gradients
// instead of adding to them, which saves a pass over them every step.
void cpu_replica::zero_grad() {
  grads_written_ = false;
  samples_ = 0.0;
}

std::span<float> cpu_replica::gradients() {
  if (!grads_written_) {  // a step without samples: the buffers stay the step's (See Note [Module buffers])
    grads_.fill(0.0f);
    const std::size_t b = layout_.buffer_begin, end = layout_.parameter_size;
    std::copy(state().data() + b, state().data() + end, grads_.data() + b);
    grads_written_ = true;
  }
  return grads_.span();
}

std::size_t cpu_replica::gather(const batch_ref& rows) {
  const std::size_t n = rows.indices.size();
  assert(n <= max_rows());
  assert(rows.feature_count == model_->inputs());
  const std::size_t f = rows.feature_count;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t row = rows.indices[i];
    std::memcpy(x_.data() + i * f, rows.features + row * f, f * sizeof(float));
    y_[i] = rows.labels[row];
  }
  return n;
}

batch_stats cpu_replica::accumulate(const batch_ref& rows, gradient_listener* listener) {
  const std::size_t n = gather(rows);
  if (n == 0) return {};
  struct listening {
    gradient_listener* listener;
    std::span<float> grads;
    static void call(void* self, std::size_t layer) {
      auto* l = static_cast<listening*>(self);
      l->listener->on_gradients_ready(l->grads, 2 * layer);  // the layer's weight, then its bias
    }
  } context{listener, grads_.span()};
  layer_done_callback on_layer_done;
  if (listener != nullptr) on_layer_done = {&listening::call, &context};
  const batch_stats stats =
      model_->forward_backward(state().data(), grads_.data(), x_.data(), y_.data(), n, !grads_written_, on_layer_done);
  grads_written_ = true;
  samples_ += static_cast<double>(n);
  return stats;
}

batch_stats cpu_replica::accumulate_slice(const batch_ref& rows, std::span<float> grads) {
  const std::size_t n = gather(rows);
  assert(grads.size() == layout_.parameter_size);
  if (n == 0) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    return {};
  }
  if (grads.data() == grads_.data()) grads_written_ = true;
  return model_->forward_backward(state().data(), grads.data(), x_.data(), y_.data(), n, /*overwrite=*/true);
}

std::span<float> cpu_replica::scratch_gradients(std::size_t i) {
  while (scratch_.size() <= i) scratch_.emplace_back(layout_.parameter_size);
  return scratch_[i].span();
}

batch_stats cpu_replica::evaluate(const batch_ref& rows) {
  const std::size_t n = gather(rows);
  return model_->evaluate(state().data(), x_.data(), y_.data(), n);
}

void cpu_replica::apply_update(double lr, double total_samples, std::size_t begin, std::size_t end) {
  write_update(lr, total_samples, begin, end, sections_[1 - current_]);
}

void cpu_replica::update_in_place(double lr, double total_samples) {
  const std::int64_t steps = optimizer_steps();
  if (total_samples > 0.0) write_update(lr, total_samples, 0, layout_.parameter_size, sections_[current_]);
  write_step_counter(state().span(), layout_, steps + 1);
  flush_ = false;
}

void cpu_replica::write_update(double lr, double total_samples, std::size_t begin, std::size_t end,
                               const std::vector<std::span<float>>& to) {
  if (end <= begin) return;
  const auto& from = sections_[current_];
  if (total_samples <= 0.0) {  // no samples anywhere: the state carries over
    for (std::size_t s = 0; s < from.size(); ++s)
      std::copy_n(from[s].data() + begin, end - begin, to[s].data() + begin);
    return;
  }
  // See Note [Module buffers]: the reduced region holds rank 0's buffers.
  const std::size_t buffers = std::max(begin, layout_.buffer_begin);
  if (buffers < end) {
    const auto grads = gradients();
    std::copy(grads.data() + buffers, grads.data() + end, to[0].data() + buffers);
    for (std::size_t s = 1; s < from.size(); ++s)
      if (to[s].data() != from[s].data()) std::copy(from[s].data() + buffers, from[s].data() + end, to[s].data() + buffers);
    end = buffers;
    if (end <= begin) return;
  }
  const std::size_t n = end - begin;
  std::array<std::span<const float>, 2> slots_in;  // at most two slots (AdamW)
  std::array<std::span<float>, 2> slots_out;
  const std::size_t n_slots = from.size() - 1;
  for (std::size_t s = 0; s < n_slots; ++s) {
    slots_in[s] = from[s + 1].subspan(begin, n);
    slots_out[s] = to[s + 1].subspan(begin, n);
  }
  optimizer_step(opt_, from[0].subspan(begin, n), to[0].subspan(begin, n), gradients().subspan(begin, n),
                 std::span<const std::span<const float>>(slots_in.data(), n_slots),
                 std::span<const std::span<float>>(slots_out.data(), n_slots), static_cast<float>(1.0 / total_samples), lr,
                 optimizer_steps(), flush_);
}

void cpu_replica::skip_step() { write_step_counter(state().span(), layout_, optimizer_steps() + 1); }

// See Note [Pending state].
void cpu_replica::finish_step() {
  const std::int64_t steps = optimizer_steps();
  current_ = 1 - current_;
  write_step_counter(state().span(), layout_, steps + 1);
  flush_ = false;
}

std::vector<float> cpu_replica::export_state() const { return {state().data(), state().data() + state().size()}; }

void cpu_replica::import_state(std::span<const float> state) {
  if (state.size() != this->state().size())
    throw std::invalid_argument("state has " + std::to_string(state.size()) + " floats, the replica " +
                                std::to_string(this->state().size()));
  std::copy(state.begin(), state.end(), this->state().data());
}

void cpu_replica::copy_parameters(std::span<float> out) const {
  assert(out.size() >= layout_.parameter_size);
  std::copy_n(state().data(), layout_.parameter_size, out.data());
}

std::uint64_t cpu_replica::state_checksum() const {
  // The layout, then the step counter (two floats' worth) from the tail.
  return checksum_floats(state().span().first(layout_.layout.size() + 2));
}

}  // namespace dpactor
