// Fuzz target: the IDX reader (data/idx_reader.cpp), plain and gzip. The
// reader takes a path, so each input is written to a scratch file and read;
// an input that is not gzip already is also gzip-compressed and read again
// (so the fuzzer's IDX mutations reach the gzip path as valid streams), and
// both reads must agree: the same array, or both a data_error. An array that
// loads has exactly the values its dimensions declare.

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "data/idx_reader.hpp"
#include "fuzz/fuzz_support.hpp"

namespace {

std::string gzip(std::string_view bytes) {
  uLongf size = compressBound(static_cast<uLong>(bytes.size())) + 32;
  std::string out(size, '\0');
  z_stream s{};
  // windowBits 15 + 16: a gzip header and trailer, as gzopen(..., "wb") writes.
  if (deflateInit2(&s, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    dpactor::fuzz::finding("deflateInit2 failed");
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  s.avail_in = static_cast<uInt>(bytes.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&s, Z_FINISH);
  deflateEnd(&s);
  if (rc != Z_STREAM_END) dpactor::fuzz::finding("deflate did not finish");
  out.resize(s.total_out);
  return out;
}

// The array read from `path`, or nullopt for a data_error.
std::optional<dpactor::idx_array> load(const std::filesystem::path& path) {
  std::optional<dpactor::idx_array> a;
  dpactor::fuzz::expect_clear_error<dpactor::data_error>([&] { a = dpactor::read_idx(path); });
  if (!a) return a;
  // Counted in 128 bits, saturating at 2^64, so that a product that wraps in
  // 64 bits cannot match a short array.
  const unsigned __int128 cap = static_cast<unsigned __int128>(1) << 64;
  unsigned __int128 count = 1;
  for (const auto d : a->dims) count = d == 0 ? 0 : std::min(cap, count * d);
  dpactor::fuzz::require(!a->dims.empty() && a->values.size() == count, "the values do not match the dimensions");
  return a;
}

bool same(const dpactor::idx_array& a, const dpactor::idx_array& b) {
  return a.dims == b.dims && a.type_code == b.type_code && a.values.size() == b.values.size() &&
         (a.values.empty() || std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dpactor;
  static const fuzz::scratch_file plain("input.idx"), zipped("input.idx.gz");
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::optional<idx_array> a = load(plain.write(bytes));
  if (bytes.starts_with("\x1f\x8b")) return 0;
  const std::optional<idx_array> b = load(zipped.write(gzip(bytes)));
  fuzz::require(a.has_value() == b.has_value(), a ? "loads plain but not gzip-compressed" : "loads gzip-compressed but not plain");
  if (a) fuzz::require(same(*a, *b), "plain and gzip-compressed load different arrays");
  return 0;
}
