#include <dpactor/flat_layout.hpp>

#include <numeric>

#include "tensors/aligned_buffer.hpp"  // buffer_alignment

namespace dpactor {
namespace {
constexpr std::size_t align_elements = buffer_alignment / sizeof(float);
}

std::size_t tensor_spec::numel() const noexcept {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1},
                         [](std::size_t a, std::int64_t d) { return a * static_cast<std::size_t>(d); });
}

std::size_t flat_layout::add(std::string name, std::vector<std::int64_t> shape) {
  tensor_spec spec{std::move(name), std::move(shape), size_};
  size_ += (spec.numel() + align_elements - 1) / align_elements * align_elements;
  tensors_.push_back(std::move(spec));
  return tensors_.size() - 1;
}

std::size_t flat_layout::numel() const noexcept {
  std::size_t n = 0;
  for (const auto& t : tensors_) n += t.numel();
  return n;
}

const tensor_spec* flat_layout::find(const std::string& name) const noexcept {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

bool flat_layout::operator==(const flat_layout& other) const noexcept {
  if (tensors_.size() != other.tensors_.size()) return false;
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name != other.tensors_[i].name || tensors_[i].shape != other.tensors_[i].shape)
      return false;
  return true;
}

}  // namespace dpactor
