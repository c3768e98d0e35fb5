#include "comms/counted_collective.hpp"

namespace dpactor {

void bytes_counter::add(std::uint64_t bytes, bool exchange) noexcept {
  sent.fetch_add(bytes, std::memory_order_relaxed);
  if (!exchange) return;
  std::uint64_t largest = largest_call.load(std::memory_order_relaxed);
  while (bytes > largest && !largest_call.compare_exchange_weak(largest, bytes, std::memory_order_relaxed)) {
  }
}

counted_collective::counted_collective(std::unique_ptr<collective> inner, bytes_counter& counter)
    : inner_(std::move(inner)), counter_(counter) {}

std::uint64_t counted_collective::scatter_bytes(std::size_t floats, std::uint64_t width) const noexcept {
  const auto [begin, end] = inner_->chunk(floats, inner_->rank());
  return width * static_cast<std::uint64_t>(floats - (end - begin));
}

std::uint64_t counted_collective::gather_bytes(std::size_t floats, std::uint64_t width) const noexcept {
  const auto [begin, end] = inner_->chunk(floats, inner_->rank());
  return width * static_cast<std::uint64_t>(end - begin) * static_cast<std::uint64_t>(inner_->size() - 1);
}

// The calls count once they return: a call that failed sent an unknown part.
void counted_collective::all_reduce_sum(std::span<float> data, const collective_options& options) {
  inner_->all_reduce_sum(data, options);
  counter_.add(scatter_bytes(data.size()) + gather_bytes(data.size()));
}

void counted_collective::all_reduce_sum_int8(std::span<std::int8_t> data, const collective_options& options) {
  inner_->all_reduce_sum_int8(data, options);
  const std::uint64_t width = inner_->moves_int8() ? 1 : 4;
  counter_.add(scatter_bytes(data.size(), width) + gather_bytes(data.size(), width));
}

void counted_collective::reduce_scatter_tree_bf16(std::size_t slices, std::span<const tree_part_bf16> parts,
                                                  std::span<float> out, const collective_options& options) {
  inner_->reduce_scatter_tree_bf16(slices, parts, out, options);
  const std::uint64_t width = inner_->moves_bf16() ? 2 : 4;
  std::uint64_t bytes = 0;
  for (const auto& p : parts) bytes += scatter_bytes(p.data.size(), width);
  counter_.add(bytes);
}

void counted_collective::all_gather_bf16(std::span<std::uint16_t> data, const collective_options& options) {
  inner_->all_gather_bf16(data, options);
  counter_.add(gather_bytes(data.size(), inner_->moves_bf16() ? 2 : 4));
}

void counted_collective::reduce_scatter_sum(std::span<float> data, const collective_options& options) {
  inner_->reduce_scatter_sum(data, options);
  counter_.add(scatter_bytes(data.size()));
}

void counted_collective::all_gather(std::span<const std::span<float>> buffers, const collective_options& options) {
  inner_->all_gather(buffers, options);
  std::uint64_t bytes = 0;
  for (const auto& b : buffers) bytes += gather_bytes(b.size());
  counter_.add(bytes);
}

void counted_collective::broadcast(std::span<float> data, int root, const collective_options& options) {
  inner_->broadcast(data, root, options);
  if (root == inner_->rank())
    counter_.add(4u * static_cast<std::uint64_t>(data.size()) * static_cast<std::uint64_t>(inner_->size() - 1),
                 /*exchange=*/false);
}

void counted_collective::reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts,
                                             std::span<float> out, const collective_options& options) {
  inner_->reduce_scatter_tree(slices, parts, out, options);
  std::uint64_t bytes = 0;
  for (const auto& p : parts) bytes += scatter_bytes(p.data.size());
  counter_.add(bytes);
}

bool counted_collective::all_reduce_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                                         std::span<float> header,
                                         const std::function<bool(std::span<const float>)>& proceed,
                                         const collective_options& header_options, const collective_options& options) {
  const bool proceeded = inner_->all_reduce_tree(slices, parts, out, header, proceed, header_options, options);
  counter_.add(scatter_bytes(header.size()) + gather_bytes(header.size()));
  if (!proceeded) return false;
  std::uint64_t bytes = 0;
  for (const auto& p : parts) bytes += scatter_bytes(p.data.size());
  counter_.add(bytes);
  counter_.add(gather_bytes(out.size()));
  return true;
}

bool counted_collective::all_reduce_with_header(std::span<float> data, std::span<float> header,
                                                const std::function<bool(std::span<const float>)>& proceed,
                                                const collective_options& header_options,
                                                const collective_options& options) {
  const bool proceeded = inner_->all_reduce_with_header(data, header, proceed, header_options, options);
  counter_.add(scatter_bytes(header.size()) + gather_bytes(header.size()));
  if (!proceeded) return false;
  counter_.add(scatter_bytes(data.size()));
  counter_.add(gather_bytes(data.size()));
  return true;
}

void counted_collective::start_reduce_scatter(std::span<float> data, void* after) {
  inner_->start_reduce_scatter(data, after);
  counter_.add(scatter_bytes(data.size()));
}

}  // namespace dpactor
