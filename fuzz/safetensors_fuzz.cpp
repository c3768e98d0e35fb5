// Fuzz target: the safetensors reader (tensors/safetensors.cpp), through its
// in-memory entry point decode_safetensors (load_safetensors is read_file
// plus this). A file that loads has F32 values for exactly its shape, and if
// all its tensors are F32 it encodes and decodes back to the same tensors.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.hpp"
#include "tensors/safetensors.hpp"

namespace {

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

bool same_tensors(const dpactor::safetensors_file& a, const dpactor::safetensors_file& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.values.size() != y.values.size() ||
        (!x.values.empty() && std::memcmp(x.values.data(), y.values.data(), x.values.size() * sizeof(float)) != 0))
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dpactor;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clear_error<checkpoint_error>([&] {
    const safetensors_file file = decode_safetensors(bytes, "fuzz.safetensors");
    bool all_f32 = true;
    for (const auto& t : file.tensors) {
      all_f32 = all_f32 && t.dtype == "F32";
      if (t.dtype == "F32")
        fuzz::require(t.values.size() == numel(t.shape), "tensor \"" + t.name + "\" has values for another shape");
    }
    if (!all_f32) return;
    std::vector<tensor_to_save> again;
    for (const auto& t : file.tensors) again.push_back({t.name, t.shape, t.values});
    try {
      fuzz::require(same_tensors(decode_safetensors(encode_safetensors(again, file.metadata), "again"), file),
                    "a loaded file encodes and decodes to other tensors");
    } catch (const checkpoint_error& e) {
      fuzz::finding(std::string("a loaded file encodes to a file that does not load: ") + e.what());
    }
  });
  return 0;
}
