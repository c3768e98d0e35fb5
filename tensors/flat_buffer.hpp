#pragma once
// One allocation holding many named tensors. All parameters of a replica live
// in one flat_buffer, all gradients in another with the same layout, and so on
// for each optimizer slot: the collective reduces the whole thing in one call
// and the optimizer updates it in one pass. Each tensor starts on a 64-byte
// boundary; the padding between tensors is zero and stays zero under every
// optimizer, so treating the buffer as one vector is exact.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensors/aligned_buffer.hpp"

namespace dpactor {

struct tensor_spec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;  // in elements, from the start of the buffer
  std::size_t numel() const noexcept;
};

class flat_layout {
 public:
  // Appends a tensor; returns its index.
  std::size_t add(std::string name, std::vector<std::int64_t> shape);
  const std::vector<tensor_spec>& tensors() const noexcept { return tensors_; }
  // Total length including padding.
  std::size_t size() const noexcept { return size_; }
  // Sum of the tensors' element counts, without padding.
  std::size_t numel() const noexcept;
  // The tensor with this name, or nullptr.
  const tensor_spec* find(const std::string& name) const noexcept;
  bool operator==(const flat_layout& other) const noexcept;

 private:
  std::vector<tensor_spec> tensors_;
  std::size_t size_ = 0;
};

class flat_buffer {
 public:
  flat_buffer() = default;
  // `extra` floats follow the last tensor in the same allocation (for example
  // a sample count reduced together with the gradients).
  explicit flat_buffer(flat_layout layout, std::size_t extra = 0);

  const flat_layout& layout() const noexcept { return layout_; }
  // The tensors and their padding, without the extra floats.
  std::span<float> values() noexcept { return storage_.span().first(layout_.size()); }
  std::span<const float> values() const noexcept { return storage_.span().first(layout_.size()); }
  // Everything including the extra floats.
  std::span<float> with_extra() noexcept { return storage_.span(); }
  std::span<float> extra() noexcept { return storage_.span().subspan(layout_.size()); }
  std::span<float> view(std::size_t index) noexcept;
  std::span<const float> view(std::size_t index) const noexcept;
  float* data() noexcept { return storage_.data(); }
  const float* data() const noexcept { return storage_.data(); }
  void zero() noexcept { storage_.fill(0.0f); }

 private:
  flat_layout layout_;
  aligned_buffer<float> storage_;
};

}  // namespace dpactor
