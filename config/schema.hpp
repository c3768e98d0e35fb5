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
// A TOML basic string: double quotes, backslash escapes.
std::string quote(const std::string& s);

}  // namespace dpactor::config_schema
