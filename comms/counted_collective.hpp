#pragma once
// An endpoint that counts the bytes its rank sends, around any backend's.
//
// Note [Bytes sent]
// Every call adds the bytes this rank's data sends to the other ranks in the
// algorithm every backend here runs (reduce-scatter then all-gather, the
// ring's volumes): reduce_scatter_sum of n floats sends the n - c floats of
// the chunks other ranks own (c: this rank's chunk); all_gather sends this
// rank's chunk of each buffer to each of the m - 1 others; all_reduce_sum is
// both; broadcast sends the buffer to each of the m - 1 others from the root;
// reduce_scatter_tree sends, of each tree node this rank holds, the chunks
// the others own; all_reduce_sum_int8 is all_reduce_sum's volumes at one
// byte a value (four where the backend widens them to floats), and the bf16
// tree reduce-scatter and all-gather two. A rank alone
// sends nothing. Four bytes a float; the
// rendezvous and CAF's control messages are not counted. The device's
// counter lives in its device_control, so it adds up across generations, and
// the reducer reports the sum over devices (step events, the summary,
// /metrics dpactor_bytes_sent_total), and the largest single call of an
// exchange (the broadcast of the state to a new generation is counted in the
// sum, not in the largest).

#include <atomic>
#include <cstdint>
#include <memory>

#include "comms/collective.hpp"

namespace dpactor {

struct bytes_counter {
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> largest_call{0};  // the most bytes one exchange call sent
  // `exchange`: a call of a step's or round's exchange (not the state's
  // broadcast at a generation's start), which largest_call is about.
  void add(std::uint64_t bytes, bool exchange = true) noexcept;
};

class counted_collective final : public collective {
 public:
  counted_collective(std::unique_ptr<collective> inner, bytes_counter& counter);

  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  std::pair<std::size_t, std::size_t> chunk(std::size_t size, int rank) const noexcept override {
    return inner_->chunk(size, rank);
  }
  void all_reduce_sum(std::span<float> data, const collective_options& options) override;
  void reduce_scatter_sum(std::span<float> data, const collective_options& options) override;
  void all_gather(std::span<const std::span<float>> buffers, const collective_options& options) override;
  void broadcast(std::span<float> data, int root, const collective_options& options) override;
  void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                           const collective_options& options) override;
  void barrier(const collective_options& options) override { inner_->barrier(options); }
  // Counted as the three calls it stands for (See Note [One call a step]).
  bool all_reduce_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                       std::span<float> header, const std::function<bool(std::span<const float>)>& proceed,
                       const collective_options& header_options, const collective_options& options) override;
  bool all_reduce_with_header(std::span<float> data, std::span<float> header,
                              const std::function<bool(std::span<const float>)>& proceed,
                              const collective_options& header_options, const collective_options& options) override;
  // One byte a value where the backend moves int8, else four (it widens).
  void all_reduce_sum_int8(std::span<std::int8_t> data, const collective_options& options) override;
  bool moves_int8() const noexcept override { return inner_->moves_int8(); }
  // Two bytes a value where the backend moves bf16, else four.
  void reduce_scatter_tree_bf16(std::size_t slices, std::span<const tree_part_bf16> parts, std::span<float> out,
                                const collective_options& options) override;
  void all_gather_bf16(std::span<std::uint16_t> data, const collective_options& options) override;
  bool moves_bf16() const noexcept override { return inner_->moves_bf16(); }
  bool gathers_gradients() const noexcept override { return inner_->gathers_gradients(); }
  bool overlaps_compute() const noexcept override { return inner_->overlaps_compute(); }
  void start_reduce_scatter(std::span<float> data, void* after) override;

  // The bytes of each kind of call, by Note [Bytes sent], for values of
  // `width` bytes.
  std::uint64_t scatter_bytes(std::size_t floats, std::uint64_t width = 4) const noexcept;
  std::uint64_t gather_bytes(std::size_t floats, std::uint64_t width = 4) const noexcept;

 private:
  std::unique_ptr<collective> inner_;
  bytes_counter& counter_;
};

}  // namespace dpactor
