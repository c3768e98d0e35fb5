#include "tensors/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace dpactor {
namespace {

[[noreturn]] void type_error(const char* expected) {
  throw std::invalid_argument(std::string("JSON value is not ") + expected);
}

class parser {
 public:
  explicit parser(std::string_view text) : text_(text) {}

  json parse_document() {
    json v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  static constexpr int max_depth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }

  bool consume_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  json parse_value(int depth) {
    if (depth > max_depth) fail("nesting too deep");
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    const char c = text_[pos_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return json(parse_string());
    if (consume_word("true")) return json(true);
    if (consume_word("false")) return json(false);
    if (consume_word("null")) return json(nullptr);
    return parse_number();
  }

  json parse_object(int depth) {
    expect('{');
    json::object members;
    if (consume('}')) return json(std::move(members));
    do {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a member name");
      std::string key = parse_string();
      for (const auto& [k, v] : members)
        if (k == key) fail("duplicate member \"" + key + "\"");
      expect(':');
      members.emplace_back(std::move(key), parse_value(depth + 1));
    } while (consume(','));
    expect('}');
    return json(std::move(members));
  }

  json parse_array(int depth) {
    expect('[');
    json::array elements;
    if (consume(']')) return json(std::move(elements));
    do {
      elements.push_back(parse_value(depth + 1));
    } while (consume(','));
    expect(']');
    return json(std::move(elements));
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      switch (text_[pos_++]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && consume_word("\\u")) {
            const unsigned low = parse_hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  json parse_number() {
    const std::size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    bool is_float = false;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    const std::string_view token = text_.substr(start, pos_ - start);
    if (token.empty() || token == "-") fail("expected a value");
    if (!is_float) {
      std::int64_t v = 0;
      auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
      if (ec == std::errc() && end == token.data() + token.size()) return json(v);
    }
    double d = 0.0;
    auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), d);
    if (ec != std::errc() || end != token.data() + token.size()) fail("bad number '" + std::string(token) + "'");
    return json(d);
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

bool json::as_bool() const {
  if (!is_bool()) type_error("a boolean");
  return std::get<bool>(value_);
}

std::int64_t json::as_int() const {
  if (!is_int()) type_error("an integer");
  return std::get<std::int64_t>(value_);
}

double json::as_double() const {
  if (is_int()) return static_cast<double>(std::get<std::int64_t>(value_));
  if (!std::holds_alternative<double>(value_)) type_error("a number");
  return std::get<double>(value_);
}

const std::string& json::as_string() const {
  if (!is_string()) type_error("a string");
  return std::get<std::string>(value_);
}

const json::array& json::as_array() const {
  if (!is_array()) type_error("an array");
  return std::get<array>(value_);
}

json::array& json::as_array() {
  if (!is_array()) type_error("an array");
  return std::get<array>(value_);
}

const json::object& json::as_object() const {
  if (!is_object()) type_error("an object");
  return std::get<object>(value_);
}

const json* json::find(std::string_view key) const {
  for (const auto& [k, v] : as_object())
    if (k == key) return &v;
  return nullptr;
}

const json& json::at(std::string_view key) const {
  if (const json* v = find(key)) return *v;
  throw std::invalid_argument("JSON object has no member \"" + std::string(key) + "\"");
}

json& json::set(std::string key, json value) {
  if (!is_object()) type_error("an object");
  auto& members = std::get<object>(value_);
  for (auto& [k, v] : members)
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  members.emplace_back(std::move(key), std::move(value));
  return *this;
}

json& json::push(json value) {
  as_array().push_back(std::move(value));
  return *this;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

void json::dump_to(std::string& out) const {
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::nullptr_t>) {
          out += "null";
        } else if constexpr (std::is_same_v<T, bool>) {
          out += v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          out += std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          if (!std::isfinite(v)) {
            out += "null";  // JSON has no NaN or infinity
          } else {
            char buf[32];
            auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
            out.append(buf, end);
          }
        } else if constexpr (std::is_same_v<T, std::string>) {
          out += json_quote(v);
        } else if constexpr (std::is_same_v<T, array>) {
          out += '[';
          for (std::size_t i = 0; i < v.size(); ++i) {
            if (i) out += ',';
            v[i].dump_to(out);
          }
          out += ']';
        } else {
          out += '{';
          for (std::size_t i = 0; i < v.size(); ++i) {
            if (i) out += ',';
            out += json_quote(v[i].first);
            out += ':';
            v[i].second.dump_to(out);
          }
          out += '}';
        }
      },
      value_);
}

std::string json::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

json json::parse(std::string_view text) { return parser(text).parse_document(); }

}  // namespace dpactor
