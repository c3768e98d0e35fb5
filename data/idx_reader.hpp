#pragma once
// The IDX format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
// a 4-byte magic 0x00 0x00 <type> <ndims>, ndims big-endian u32 dimensions,
// then the values, big-endian, row-major. Files may be gzip-compressed; the
// reader detects that from the content, not the name.

#include <cstdint>
#include <filesystem>
#include <vector>

namespace dpactor {

struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<float> values;  // converted from the stored type
  std::uint8_t type_code = 0; // 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64
};

// Throws data_error naming the file and the problem (missing, bad magic,
// unsupported type, dimensions whose product overflows or is more than the
// file holds, truncated, corrupt gzip stream). The header's sizes are checked
// before anything is allocated; memory follows the data really read.
idx_array read_idx(const std::filesystem::path& path);

}  // namespace dpactor
