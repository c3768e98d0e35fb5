#pragma once
// How the key table (config/key_table.cpp) states its keys: one call of
// schema_builder per key, with its field, range and documentation, which
// reads the key's TOML node with the key's checks and prints it back. For
// the config library's own files only, like config/schema.hpp.

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/schema.hpp"

namespace dpactor::config_schema {

// A TOML array of the values, each printed by toml_text: [1, 28, 28].
template <class T>
std::string array_text(const std::vector<T>& values) {
  std::string out = "[";
  for (const T& v : values) {
    if (out.size() > 1) out += ", ";
    if constexpr (std::is_integral_v<T>) out += toml_text(toml::value<std::int64_t>{static_cast<std::int64_t>(v)});
    else out += toml_text(toml::value<T>{v});
  }
  return out + "]";
}

template <class Field>
using accessor = std::function<Field&(job_config&)>;

struct schema_builder {
  std::vector<key_spec> keys;
  std::string section;

  void integer(std::string name, accessor<std::int64_t> field, std::int64_t lo, std::string doc,
               std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
    keys.push_back({section, std::move(name), "integer", std::move(doc),
                    [=](job_config& c, const toml::node& n, const std::string& key) { field(c) = read_int(n, key, lo, hi); },
                    [=](const job_config& c) { return std::to_string(field(const_cast<job_config&>(c))); }});
  }
  void floating(std::string name, accessor<double> field, double lo, bool lo_open, std::string doc,
                double hi = std::numeric_limits<double>::max()) {
    keys.push_back({section, std::move(name), "float", std::move(doc),
                    [=](job_config& c, const toml::node& n, const std::string& key) {
                      field(c) = read_float(n, key, lo, hi, lo_open);
                    },
                    [=](const job_config& c) { return number_text(field(const_cast<job_config&>(c))); }});
  }
  void boolean(std::string name, accessor<bool> field, std::string doc) {
    keys.push_back({section, std::move(name), "boolean", std::move(doc),
                    [=](job_config& c, const toml::node& n, const std::string& key) {
                      if (!n.is_boolean()) fail_at(n, key, "expected a boolean (true or false), found " + type_name(n));
                      field(c) = n.as_boolean()->get();
                    },
                    [=](const job_config& c) { return std::string(field(const_cast<job_config&>(c)) ? "true" : "false"); }});
  }
  void string(std::string name, accessor<std::string> field, std::string doc) {
    keys.push_back({section, std::move(name), "string", std::move(doc),
                    [=](job_config& c, const toml::node& n, const std::string& key) { field(c) = read_string(n, key); },
                    [=](const job_config& c) { return quote(field(const_cast<job_config&>(c))); }});
  }
  // A string naming one of a fixed set of choices.
  template <class E>
  void choice(std::string name, accessor<E> field, std::vector<std::pair<std::string, E>> choices, std::string doc) {
    std::string list;
    for (const auto& [text, value] : choices) list += (list.empty() ? "" : ", ") + quote(text);
    keys.push_back({section, std::move(name), "string: " + list, std::move(doc),
                    [=](job_config& c, const toml::node& n, const std::string& key) {
                      const std::string& s = read_string(n, key);
                      for (const auto& [text, value] : choices)
                        if (text == s) {
                          field(c) = value;
                          return;
                        }
                      fail_at(n, key, "unknown value " + quote(s) + ": expected one of " + list);
                    },
                    [=](const job_config& c) {
                      for (const auto& [text, value] : choices)
                        if (value == field(const_cast<job_config&>(c))) return quote(text);
                      return std::string("\"?\"");
                    }});
  }
};

}  // namespace dpactor::config_schema
