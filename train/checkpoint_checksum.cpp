#include "train/checkpoint_checksum.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdio>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

class crc {
 public:
  void add(std::string_view bytes) {
    value_ = ::crc32_z(value_, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  }
  void add_field(std::string_view text) {
    add(text);
    add(std::string_view("\0", 1));  // so that ("ab","c") and ("a","bc") differ
  }
  void add_shape(const std::vector<std::int64_t>& shape) {
    for (const std::int64_t d : shape) add_field(std::to_string(d));
  }
  void add_floats(std::span<const float> values) {
    add(std::string_view(reinterpret_cast<const char*>(values.data()), values.size_bytes()));
  }
  std::string hex() const {
    char out[9];
    std::snprintf(out, sizeof out, "%08lx", value_);
    return out;
  }

 private:
  unsigned long value_ = ::crc32_z(0, nullptr, 0);
};

void add_metadata(crc& c, string_pairs metadata) {
  std::erase_if(metadata, [](const auto& kv) { return kv.first == tensor_checksum_key; });
  std::sort(metadata.begin(), metadata.end());
  for (const auto& [key, value] : metadata) {
    c.add_field(key);
    c.add_field(value);
  }
}

}  // namespace

std::string crc32_hex(std::string_view bytes) {
  crc c;
  c.add(bytes);
  return c.hex();
}

std::string tensor_file_checksum(const std::vector<tensor_to_save>& tensors, const string_pairs& metadata) {
  crc c;
  add_metadata(c, metadata);
  std::vector<const tensor_to_save*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  for (const auto* t : order) {
    c.add_field(t->name);
    c.add_field("F32");
    c.add_shape(t->shape);
    c.add_floats(t->values);
  }
  return c.hex();
}

void verify_tensor_file(const safetensors_file& file, const std::string& origin, bool required) {
  const std::string* stored = file.find_metadata(tensor_checksum_key);
  if (stored == nullptr) {
    if (required)
      throw checkpoint_error(origin + ": no \"" + tensor_checksum_key +
                             "\" in the metadata, which this checkpoint format requires: the file was damaged or replaced");
    return;
  }
  crc c;
  add_metadata(c, file.metadata);
  std::vector<const loaded_tensor*> order;
  for (const auto& t : file.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  for (const auto* t : order) {
    c.add_field(t->name);
    c.add_field(t->dtype);
    c.add_shape(t->shape);
    c.add_floats(t->values);
  }
  if (c.hex() != *stored)
    throw checkpoint_error(origin + ": checksum mismatch (stored " + *stored + ", contents give " + c.hex() +
                           "): the file was changed or damaged after it was written");
}

}  // namespace dpactor
