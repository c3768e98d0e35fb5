#pragma once
// A small JSON value with a strict parser and a compact writer: enough for
// safetensors headers, trainer.json and metrics records. Objects keep their
// insertion order so written files are stable and diffable.

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dpactor {

class json {
 public:
  using array = std::vector<json>;
  using object = std::vector<std::pair<std::string, json>>;

  json() = default;  // null
  json(std::nullptr_t) {}
  json(bool b) : value_(b) {}
  json(int v) : value_(static_cast<std::int64_t>(v)) {}
  json(long v) : value_(static_cast<std::int64_t>(v)) {}
  json(long long v) : value_(static_cast<std::int64_t>(v)) {}
  json(unsigned v) : value_(static_cast<std::int64_t>(v)) {}
  json(unsigned long v) : value_(static_cast<std::int64_t>(v)) {}
  json(unsigned long long v) : value_(static_cast<std::int64_t>(v)) {}
  json(double v) : value_(v) {}
  json(const char* s) : value_(std::string(s)) {}
  json(std::string s) : value_(std::move(s)) {}
  json(std::string_view s) : value_(std::string(s)) {}
  json(array a) : value_(std::move(a)) {}
  json(object o) : value_(std::move(o)) {}

  static json make_object() { return json(object{}); }
  static json make_array() { return json(array{}); }

  bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(value_); }
  bool is_bool() const noexcept { return std::holds_alternative<bool>(value_); }
  bool is_int() const noexcept { return std::holds_alternative<std::int64_t>(value_); }
  bool is_number() const noexcept { return is_int() || std::holds_alternative<double>(value_); }
  bool is_string() const noexcept { return std::holds_alternative<std::string>(value_); }
  bool is_array() const noexcept { return std::holds_alternative<array>(value_); }
  bool is_object() const noexcept { return std::holds_alternative<object>(value_); }

  // Accessors throw std::invalid_argument naming the expected type.
  bool as_bool() const;
  std::int64_t as_int() const;  // integers only
  double as_double() const;     // any number
  const std::string& as_string() const;
  const array& as_array() const;
  array& as_array();
  const object& as_object() const;

  // Object members: find returns nullptr when absent; at throws naming the key.
  const json* find(std::string_view key) const;
  const json& at(std::string_view key) const;
  // Appends a member (objects) or an element (arrays); returns *this.
  json& set(std::string key, json value);
  json& push(json value);

  // Compact text; doubles are written with enough digits to read back exactly.
  std::string dump() const;
  // Throws std::invalid_argument with the byte offset of the problem.
  static json parse(std::string_view text);

 private:
  void dump_to(std::string& out) const;
  std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, array, object> value_;
};

// Quotes and escapes a string for JSON.
std::string json_quote(std::string_view s);

}  // namespace dpactor
