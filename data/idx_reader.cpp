#include "data/idx_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

// Reads exactly n bytes or throws, telling a truncated file from a corrupt one.
class gz_input {
 public:
  explicit gz_input(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw data_error(path.string() + ": no such file");
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) throw data_error(path.string() + ": cannot open: " + std::strerror(errno));
    gzbuffer(file_, 1 << 17);
  }
  ~gz_input() {
    if (file_ != nullptr) gzclose(file_);
  }
  gz_input(const gz_input&) = delete;
  gz_input& operator=(const gz_input&) = delete;

  void read(void* out, std::size_t n, const std::string& what) {
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n, 1u << 30));
      const int got = gzread(file_, p, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw data_error(path_.string() + ": corrupt or truncated data after " + std::to_string(offset_) +
                         " bytes, while reading " + what + ": " + msg);
      }
      if (got == 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw data_error(path_.string() + ": truncated: the file ends after " + std::to_string(offset_) +
                         " bytes, inside the " + what +
                         (code != Z_OK && code != Z_STREAM_END ? std::string(" (") + msg + ")" : std::string()));
      }
      p += got;
      n -= static_cast<std::size_t>(got);
      offset_ += static_cast<std::size_t>(got);
    }
  }

  bool at_end() {
    unsigned char extra = 0;
    return gzread(file_, &extra, 1) == 0;
  }

  // True when the file is read as it is (not gzip), after the first read.
  bool plain() { return gzdirect(file_) == 1; }
  // Bytes read so far (decompressed, for gzip).
  std::size_t offset() const noexcept { return offset_; }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
  std::size_t offset_ = 0;
};

// Headers that declare more values than this are refused as corrupt: 2^34
// values are 16 GiB as u8, 64 GiB once converted to float.
constexpr std::size_t max_values = std::size_t{1} << 34;
// Values are read and converted this many bytes at a time (a multiple of
// every element size).
constexpr std::size_t read_chunk_bytes = std::size_t{1} << 20;
constexpr std::size_t max_reserved_values = std::size_t{1} << 28;

std::uint32_t big_endian_u32(const unsigned char* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

std::size_t type_size(std::uint8_t code) {
  switch (code) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
  }
}

template <class T>
T load_big_endian(const unsigned char* p) {
  using U = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  U u = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) u = static_cast<U>((u << 8) | p[i]);
  return std::bit_cast<T>(u);
}

float convert(std::uint8_t code, const unsigned char* p) {
  switch (code) {
    case 0x08: return static_cast<float>(*p);
    case 0x09: return static_cast<float>(static_cast<std::int8_t>(*p));
    case 0x0B: return static_cast<float>(load_big_endian<std::int16_t>(p));
    case 0x0C: return static_cast<float>(load_big_endian<std::int32_t>(p));
    case 0x0D: return load_big_endian<float>(p);
    case 0x0E: return static_cast<float>(load_big_endian<double>(p));
    default: return 0.0f;
  }
}

}  // namespace

idx_array read_idx(const std::filesystem::path& path) {
  gz_input in(path);
  unsigned char magic[4];
  in.read(magic, 4, "magic number");
  const std::uint32_t magic_value = big_endian_u32(magic);
  idx_array out;
  out.type_code = magic[2];
  const std::size_t elem = type_size(magic[2]);
  if (magic[0] != 0 || magic[1] != 0 || elem == 0 || magic[3] == 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08X", magic_value);
    throw data_error(path.string() + ": bad magic number " + hex +
                     ": not an IDX file (expected 0x0000TTNN, e.g. 0x00000803 for images, 0x00000801 for labels)");
  }
  // The header's sizes are checked before anything is allocated: their
  // product, then (for a plain file) against the bytes the file really has.
  std::size_t count = 1;
  bool overflow = false;
  std::string shape;
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char b[4];
    in.read(b, 4, "dimensions");
    out.dims.push_back(big_endian_u32(b));
    shape += (d == 0 ? "" : " x ") + std::to_string(out.dims.back());
    overflow = overflow || __builtin_mul_overflow(count, std::size_t{out.dims.back()}, &count);
  }
  if (overflow || count > max_values)
    throw data_error(path.string() + ": header declares dimensions " + shape + ", " +
                     (overflow ? std::string("whose product overflows 64 bits")
                               : std::to_string(count) + " values, more than the " + std::to_string(max_values) +
                                     " this reader accepts") +
                     " (corrupt header?)");
  const std::size_t header_bytes = in.offset();
  const std::size_t value_bytes = count * elem;
  const std::string declared = std::to_string(count) + " values its header declares (" + shape + ")";
  std::error_code ec;
  const std::uintmax_t file_bytes = in.plain() ? std::filesystem::file_size(path, ec) : 0;
  if (in.plain() && !ec && file_bytes >= header_bytes) {
    const std::uintmax_t after_header = file_bytes - header_bytes;
    if (after_header < value_bytes)
      throw data_error(path.string() + ": truncated: the " + declared + " take " + std::to_string(value_bytes) +
                       " bytes after the " + std::to_string(header_bytes) + "-byte header, but the file has only " +
                       std::to_string(after_header));
    if (after_header > value_bytes)
      throw data_error(path.string() + ": has data after the " + declared + ": they take " +
                       std::to_string(value_bytes) + " bytes after the " + std::to_string(header_bytes) +
                       "-byte header, the file has " + std::to_string(after_header));
  }
  // Read in pieces, so that memory follows the data that is really there
  // (a gzip stream's length is not known until it ends); the values the
  // header declares are reserved up to 1 GiB (address space, touched as the
  // data arrives), so that a data set of that size is not copied as its
  // vector grows (Fashion-MNIST's 47 million values were, twice over, most
  // of a run's start-up).
  out.values.reserve(std::min(count, max_reserved_values));
  std::vector<unsigned char> raw(std::min(value_bytes, read_chunk_bytes));
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(count - done, raw.size() / elem);
    in.read(raw.data(), n * elem, declared);
    if (out.type_code == 0x08) {  // unsigned bytes, the usual case (images): converted as they are appended
      out.values.insert(out.values.end(), raw.data(), raw.data() + n);
    } else {
      out.values.resize(done + n);
      for (std::size_t i = 0; i < n; ++i) out.values[done + i] = convert(out.type_code, raw.data() + i * elem);
    }
    done += n;
  }
  if (!in.at_end()) throw data_error(path.string() + ": has data after the " + declared);
  return out;
}

}  // namespace dpactor
