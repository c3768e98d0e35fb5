// The schema's reading and printing of single values (config/schema.hpp).

#include "config/schema.hpp"

#include <charconv>
#include <limits>
#include <sstream>

#include <dpactor/error.hpp>
#include "tensors/visible_text.hpp"

namespace dpactor::config_schema {

std::string location(const toml::node& node) {
  const auto& src = node.source();
  const std::string path = visible(src.path ? *src.path : std::string("<config>"));
  if (path.rfind("--set ", 0) == 0) return path;
  return path + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

[[noreturn]] void fail_at(const toml::node& node, const std::string& key, const std::string& what) {
  throw config_error(location(node) + ": " + visible(key) + ": " + what);
}

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

std::string toml_text(const toml::node& node) {
  std::ostringstream out;
  // No flags: basic strings on one line, every control and non-ASCII
  // character escaped (\t, \u00E9, \uFEFF), so that what is printed reads
  // back as the same value and shows what is invisible.
  out << toml::toml_formatter{node, toml::format_flags::none};
  return out.str();
}

std::string quote(const std::string& s) { return toml_text(toml::value<std::string>{s}); }

// Shortest text that reads back as the same double, always with a '.' or an
// exponent so that TOML reads it as a float.
std::string number_text(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string out(buf, end);
  if (out.find_first_of(".eEn") == std::string::npos) out += ".0";
  return out;
}

std::int64_t read_int(const toml::node& node, const std::string& key, std::int64_t lo, std::int64_t hi) {
  if (!node.is_integer()) fail_at(node, key, "expected an integer, found " + type_name(node));
  const std::int64_t v = node.as_integer()->get();
  if (v < lo) fail_at(node, key, "value " + std::to_string(v) + " is out of range: must be >= " + std::to_string(lo));
  if (v > hi) fail_at(node, key, "value " + std::to_string(v) + " is out of range: must be <= " + std::to_string(hi));
  return v;
}

double read_float(const toml::node& node, const std::string& key, double lo, double hi, bool lo_open) {
  double v = 0.0;
  if (node.is_floating_point()) v = node.as_floating_point()->get();
  else if (node.is_integer()) v = static_cast<double>(node.as_integer()->get());
  else fail_at(node, key, "expected a number, found " + type_name(node));
  if (!(v == v) || (lo_open ? v <= lo : v < lo) || v > hi) {
    std::string range = lo_open ? "> " + number_text(lo) : ">= " + number_text(lo);
    if (hi < std::numeric_limits<double>::max()) range += " and <= " + number_text(hi);
    fail_at(node, key, "value " + number_text(v) + " is out of range: must be " + range);
  }
  return v;
}

const std::string& read_string(const toml::node& node, const std::string& key) {
  if (!node.is_string()) fail_at(node, key, "expected a string, found " + type_name(node));
  return node.as_string()->get();
}

}  // namespace dpactor::config_schema
