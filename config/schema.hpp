#pragma once
// The config schema, for the config library's own files only (it exposes
// toml++, which stays private to dpactor_config): one key_spec per key, in
// documentation order, each reading its TOML node into a job_config with the
// key's checks and printing it back.

#include <functional>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "config/job_config.hpp"

namespace dpactor::config_schema {

// One key of the schema: how to read it into a job_config, and how to print it.
struct key_spec {
  std::string section;
  std::string name;
  std::string type;
  std::string doc;
  std::function<void(job_config&, const toml::node&, const std::string& key)> read;
  std::function<std::string(const job_config&)> print;
};

// Every key, in documentation order.
const std::vector<key_spec>& keys();

// Where a value came from: "file:line:column", or the --set argument.
std::string location(const toml::node& node);
[[noreturn]] void fail_at(const toml::node& node, const std::string& key, const std::string& what);
std::string type_name(const toml::node& node);
// A value as TOML text, printed by toml++ (the one serialiser of every
// config text dpactor writes: --print-config, checkpoints, the coordinator's
// config for its workers).
std::string toml_text(const toml::node& node);
// A TOML basic string: double quotes, backslash escapes, on one line.
std::string quote(const std::string& s);
// Shortest text that reads back as the same double, always with a '.' or an
// exponent so that TOML reads it as a float.
std::string number_text(double v);

// A key's value with its checks; each throws config_error naming where the
// value came from (location), the key and what is wrong.
std::int64_t read_int(const toml::node& node, const std::string& key, std::int64_t lo, std::int64_t hi);
double read_float(const toml::node& node, const std::string& key, double lo, double hi, bool lo_open);
const std::string& read_string(const toml::node& node, const std::string& key);

}  // namespace dpactor::config_schema
