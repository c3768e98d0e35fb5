#include "tensors/replica.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tensors/vector_add.hpp"

namespace dpactor {

state_layout make_state_layout(const mlp_spec& spec, const optimizer_config& opt) {
  return make_state_layout(mlp_layout(spec), opt);
}

state_layout make_state_layout(const flat_layout& params, const optimizer_config& opt, std::size_t buffer_begin) {
  state_layout s;
  for (const auto& t : params.tensors()) s.layout.add(t.name, t.shape);
  s.parameter_tensors = params.tensors().size();
  s.parameter_size = s.layout.size();
  s.buffer_begin = std::min(buffer_begin, s.parameter_size);
  s.slots = optimizer_slot_names(opt);
  for (const auto& slot : s.slots)
    for (const auto& t : params.tensors()) s.layout.add(t.name + "." + slot, t.shape);
  return s;
}

flat_layout state_layout::parameters() const {
  flat_layout params;
  for (std::size_t i = 0; i < parameter_tensors; ++i) params.add(layout.tensors()[i].name, layout.tensors()[i].shape);
  return params;
}

std::int64_t read_step_counter(std::span<const float> state, const state_layout& layout) noexcept {
  std::int64_t steps = 0;
  std::memcpy(&steps, state.data() + layout.layout.size(), sizeof steps);
  return steps;
}

void write_step_counter(std::span<float> state, const state_layout& layout, std::int64_t steps) noexcept {
  std::memcpy(state.data() + layout.layout.size(), &steps, sizeof steps);
}

batch_stats replica::accumulate_slice(const batch_ref&, std::span<float>) {
  throw std::logic_error("this replica does not compute slices (train.reproducible)");
}

void replica::add_gradients(std::span<float> into, std::span<const float> from) {
  if (into.size() != from.size()) throw std::invalid_argument("add_gradients: buffers of different sizes");
  add_into(into.data(), from.data(), into.size());
}

std::span<float> replica::scratch_gradients(std::size_t) {
  throw std::logic_error("this replica does not compute slices (train.reproducible)");
}

std::uint64_t checksum_floats(std::span<const float> values) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0, n = values.size_bytes(); i < n; ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace dpactor
