#include "tensors/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include <dpactor/error.hpp>
#include "tensors/file_io.hpp"
#include "tensors/json.hpp"

namespace dpactor {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

// Headers larger than this are refused as corrupt (the reference
// implementation's limit is 100 MB).
constexpr std::uint64_t max_header_bytes = 100'000'000;

std::size_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

// The bytes a tensor's shape and dtype need, or nullopt when that overflows
// 64 bits (a shape of [2^62, 4] must not wrap to 0 bytes and pass).
std::optional<std::uint64_t> tensor_bytes(const std::vector<std::int64_t>& shape, std::size_t elem) {
  std::uint64_t n = elem;
  for (const auto d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const loaded_tensor* safetensors_file::find(const std::string& name) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const std::string* safetensors_file::find_metadata(const std::string& key) const noexcept {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

std::string encode_safetensors(const std::vector<tensor_to_save>& tensors, const string_pairs& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (const auto& t : tensors) out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  return out;
}

void save_safetensors(const std::filesystem::path& path, const std::vector<tensor_to_save>& tensors,
                      const string_pairs& metadata) {
  write_file_synced(path, encode_safetensors(tensors, metadata));
}

safetensors_file decode_safetensors(std::string_view bytes, const std::string& origin) {
  auto fail = [&origin](const std::string& what) -> checkpoint_error {
    return checkpoint_error(origin + ": not a valid safetensors file: " + what);
  };
  if (bytes.size() < 8) throw fail("file is " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > max_header_bytes || n > bytes.size() - 8)
    throw fail("header length " + std::to_string(n) + " exceeds the file size " + std::to_string(bytes.size()));
  const std::string_view text = bytes.substr(8, n);
  if (text.empty() || text.front() != '{') throw fail("header does not start with '{'");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e99999
    throw fail(std::string("header: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");

  const std::string_view data = bytes.substr(8 + n);
  safetensors_file file;
  struct span_ref {
    std::uint64_t begin, end;
    std::size_t tensor;
  };
  std::vector<span_ref> spans;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) throw fail("__metadata__ is not a JSON object");
        for (const auto& [k, v] : entry.items()) {
          if (!v.is_string()) throw fail("__metadata__ \"" + k + "\" is not a string");
          file.metadata.emplace_back(k, v.get<std::string>());
        }
        continue;
      }
      if (!entry.is_object()) throw fail("tensor \"" + name + "\": entry is not a JSON object");
      loaded_tensor t;
      t.name = name;
      t.dtype = entry.at("dtype").get<std::string>();
      const std::size_t elem = dtype_size(t.dtype);
      if (elem == 0) throw fail("tensor \"" + name + "\" has unknown dtype \"" + t.dtype + "\"");
      if (!entry.at("shape").is_array()) throw fail("tensor \"" + name + "\": shape is not an array");
      for (const auto& d : entry.at("shape")) {
        const std::int64_t dim = json_int(d, "tensor \"" + name + "\": shape");
        if (dim < 0) throw fail("tensor \"" + name + "\" has a negative dimension");
        t.shape.push_back(dim);
      }
      const auto& offsets = entry.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2) throw fail("tensor \"" + name + "\": data_offsets must have two entries");
      const std::int64_t first = json_int(offsets[0], "tensor \"" + name + "\": data_offsets");
      const std::int64_t last = json_int(offsets[1], "tensor \"" + name + "\": data_offsets");
      if (first < 0 || last < first) throw fail("tensor \"" + name + "\": bad data_offsets");
      const auto begin = static_cast<std::uint64_t>(first);
      const auto end = static_cast<std::uint64_t>(last);
      if (end > data.size())
        throw fail("tensor \"" + name + "\" ends at byte " + std::to_string(end) + " but the data section has " +
                   std::to_string(data.size()) + " bytes (truncated file?)");
      const std::optional<std::uint64_t> bytes = tensor_bytes(t.shape, elem);
      if (!bytes)
        throw fail("tensor \"" + name + "\": shape " + shape_text(t.shape) + " of " + t.dtype +
                   " needs more than 2^64 bytes");
      if (end - begin != *bytes)
        throw fail("tensor \"" + name + "\": data_offsets span " + std::to_string(end - begin) +
                   " bytes, its shape " + shape_text(t.shape) + " and dtype need " + std::to_string(*bytes));
      if (t.dtype == "F32" && end > begin) {
        // Bounded by the data section: end <= data.size() was checked above.
        t.values.resize(*bytes / sizeof(float));
        std::memcpy(t.values.data(), data.data() + begin, end - begin);
      }
      spans.push_back({begin, end, file.tensors.size()});
      file.tensors.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    throw fail(std::string("header: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw fail(std::string("header: ") + e.what());
  }
  std::sort(spans.begin(), spans.end(), [](const span_ref& a, const span_ref& b) { return a.begin < b.begin; });
  std::uint64_t expected = 0;
  for (const auto& s : spans) {
    if (s.begin != expected)
      throw fail("tensor \"" + file.tensors[s.tensor].name + "\" starts at byte " + std::to_string(s.begin) +
                 ", expected " + std::to_string(expected) + " (overlap or hole)");
    expected = s.end;
  }
  if (expected != data.size())
    throw fail("data section has " + std::to_string(data.size()) + " bytes, the tensors cover " + std::to_string(expected));
  return file;
}

safetensors_file load_safetensors(const std::filesystem::path& path) {
  return decode_safetensors(read_file(path, file_role::checkpoint), path.string());
}

}  // namespace dpactor
