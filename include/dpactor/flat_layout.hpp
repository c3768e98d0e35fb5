#pragma once
// Named tensors laid out in one flat float array (public API: a snapshot
// and a checkpoint's model.safetensors are laid out so). A replica's parameters,
// its gradients and each optimizer slot follow such a layout inside its state
// buffer (See Note [Replica state buffer]): the collective reduces all
// gradients in one call and the optimizer updates everything in one pass.
// Each tensor starts on a 64-byte boundary; the padding between tensors is
// zero and stays zero under every optimizer, so treating a section as one
// vector is exact.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

}  // namespace dpactor
