#pragma once
// The config keys for users: the reference (dpactor --config-reference,
// docs/config.md) and the effective config as TOML text.

#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace dpactor {

// Which keys a dump of the config holds: every key (the text a coordinator
// sends its workers, and the job's identity), or only those the job reads
// (what --print-config shows: a TorchScript job reads no model.layers, an
// MLP job no model.path).
enum class dumped_keys { all, read_by_the_job };

// The effective config as TOML text; it loads back as the same config.
std::string dump_job_config(const job_config& config, dumped_keys which = dumped_keys::all);

// `text` as a TOML string value (for building section.key=value overrides):
// double quotes, every control and invisible character escaped.
std::string toml_string(const std::string& text);

struct config_key_doc {
  std::string name;           // "train.epochs"
  std::string type;           // "integer", "float", "boolean", "string", ...
  std::string default_value;  // as TOML
  std::string doc;
};
// Every key of the schema, in documentation order.
std::vector<config_key_doc> config_keys();

}  // namespace dpactor
