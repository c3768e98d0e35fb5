#pragma once
// The config keys for users: the reference (dpactor --config-reference,
// docs/config.md) and the effective config as TOML text.

#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace dpactor {

// The effective config as TOML text, every key included.
std::string dump_job_config(const job_config& config);

struct config_key_doc {
  std::string name;           // "train.epochs"
  std::string type;           // "integer", "float", "boolean", "string", ...
  std::string default_value;  // as TOML
  std::string doc;
};
// Every key of the schema, in documentation order.
std::vector<config_key_doc> config_keys();

}  // namespace dpactor
