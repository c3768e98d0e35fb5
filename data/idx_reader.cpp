#include "data/idx_reader.hpp"

#include <zlib.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>

#include "tensors/error.hpp"

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
        throw data_error(path_.string() + ": corrupt or truncated data while reading " + what + ": " + msg);
      }
      if (got == 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw data_error(path_.string() + ": truncated: the file ends inside the " + what +
                         (code != Z_OK && code != Z_STREAM_END ? std::string(" (") + msg + ")" : std::string()));
      }
      p += got;
      n -= static_cast<std::size_t>(got);
    }
  }

  bool at_end() {
    unsigned char extra = 0;
    return gzread(file_, &extra, 1) == 0;
  }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
};

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
  std::size_t count = 1;
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char b[4];
    in.read(b, 4, "dimensions");
    out.dims.push_back(big_endian_u32(b));
    count *= out.dims.back();
  }
  if (count > (std::size_t{1} << 34)) throw data_error(path.string() + ": implausible dimensions (corrupt header?)");
  std::vector<unsigned char> raw(count * elem);
  in.read(raw.data(), raw.size(), std::to_string(count) + " values its header declares");
  if (!in.at_end()) throw data_error(path.string() + ": has data after the " + std::to_string(count) + " values its header declares");
  out.values.resize(count);
  for (std::size_t i = 0; i < count; ++i) out.values[i] = convert(out.type_code, raw.data() + i * elem);
  return out;
}

}  // namespace dpactor
