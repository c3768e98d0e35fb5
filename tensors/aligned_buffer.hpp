#pragma once
// A fixed-size, 64-byte aligned, zero-initialised host array of trivially
// copyable elements. Alignment to a cache line keeps vector loads aligned and
// keeps two ranks' chunks of a shared buffer off the same line.

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <type_traits>

namespace dpactor {

inline constexpr std::size_t buffer_alignment = 64;

template <class T>
class aligned_buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    std::size_t bytes = (n * sizeof(T) + buffer_alignment - 1) / buffer_alignment * buffer_alignment;
    data_.reset(static_cast<T*>(::operator new(bytes, std::align_val_t{buffer_alignment})));
    std::memset(static_cast<void*>(data_.get()), 0, bytes);
  }
  aligned_buffer(aligned_buffer&&) noexcept = default;
  aligned_buffer& operator=(aligned_buffer&&) noexcept = default;

  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return data_.get()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_.get()[i]; }
  std::span<T> span() noexcept { return {data(), size_}; }
  std::span<const T> span() const noexcept { return {data(), size_}; }
  void fill(T value) noexcept { std::fill_n(data(), size_, value); }

 private:
  struct deleter {
    void operator()(T* p) const noexcept { ::operator delete(p, std::align_val_t{buffer_alignment}); }
  };
  std::unique_ptr<T, deleter> data_;
  std::size_t size_ = 0;
};

}  // namespace dpactor
