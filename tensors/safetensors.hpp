#pragma once
// The safetensors format (https://github.com/huggingface/safetensors):
//   8 bytes   little-endian u64 N, the header length
//   N bytes   JSON header: {"name": {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
//             padded with spaces to a multiple of 8
//   rest      the tensors' bytes, little-endian, offsets relative to here,
//             contiguous, without holes or overlaps
// dpactor writes F32 tensors; it reads any dtype's header and loads F32 data.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpactor {

using string_pairs = std::vector<std::pair<std::string, std::string>>;

struct tensor_to_save {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> values;  // numel(shape) floats
};

struct loaded_tensor {
  std::string name;
  std::string dtype;  // "F32", "F16", ...
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // filled for F32 only
};

struct safetensors_file {
  string_pairs metadata;
  std::vector<loaded_tensor> tensors;  // in header order
  const loaded_tensor* find(const std::string& name) const noexcept;
  const std::string* find_metadata(const std::string& key) const noexcept;
};

// Serialises tensors in the given order; tensor bytes follow one another.
std::string encode_safetensors(const std::vector<tensor_to_save>& tensors, const string_pairs& metadata);
// Writes encode_safetensors() to `path` and fsyncs it.
void save_safetensors(const std::filesystem::path& path, const std::vector<tensor_to_save>& tensors,
                      const string_pairs& metadata);

// Parses and validates; throws checkpoint_error "<origin>: <problem>".
safetensors_file decode_safetensors(std::string_view bytes, const std::string& origin);
safetensors_file load_safetensors(const std::filesystem::path& path);

}  // namespace dpactor
