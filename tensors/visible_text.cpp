#include "tensors/visible_text.hpp"

#include <cstdint>
#include <cstdio>

namespace dpactor {
namespace {

bool invisible(std::uint32_t c) {
  return c == 0x00AD || c == 0x034F || c == 0x061C || (c >= 0x115F && c <= 0x1160) || c == 0x180E ||
         (c >= 0x200B && c <= 0x200F) || (c >= 0x2028 && c <= 0x202E) || (c >= 0x2060 && c <= 0x206F) ||
         c == 0x3164 || c == 0xFEFF || c == 0xFFA0 || (c >= 0xFFF0 && c <= 0xFFFB) || (c >= 0xE0000 && c <= 0xE007F);
}

void hex_byte(std::string& out, unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  out += buf;
}

}  // namespace

std::string visible(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (b == '\t') out += "\\t";
      else if (b == '\n') out += "\\n";
      else if (b == '\r') out += "\\r";
      else if (b < 0x20 || b == 0x7F) hex_byte(out, b);
      else out += static_cast<char>(b);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation
    // bytes; the shortest form only, no surrogates, nothing past U+10FFFF.
    const std::size_t length = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b <= 0xDF ? 2 : 0;
    std::uint32_t c = length == 2 ? b & 0x1F : length == 3 ? b & 0x0F : b & 0x07;
    bool ok = length != 0 && i + length <= text.size();
    for (std::size_t k = 1; ok && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      ok = (next & 0xC0) == 0x80;
      c = (c << 6) | (next & 0x3F);
    }
    ok = ok && !(length == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) &&
         !(length == 4 && (c < 0x10000 || c > 0x10FFFF));
    if (!ok) {
      hex_byte(out, b);
      ++i;
      continue;
    }
    if ((c >= 0x80 && c <= 0x9F) || invisible(c)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, c > 0xFFFF ? "\\U%08X" : "\\u%04X", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

}  // namespace dpactor
