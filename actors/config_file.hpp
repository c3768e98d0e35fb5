#pragma once
// Reading job configs: TOML syntax in .cfg files, checked against a schema.
// Unknown keys, wrong types and out-of-range values are config_errors that
// name the file, line and column, and the key. `--set section.key=value`
// overrides apply on top of the file with the same checks.

#include <filesystem>
#include <string>
#include <vector>

#include "actors/job_config.hpp"

namespace dpactor {

// Parses `path` (a missing file is a config_error) and applies the overrides,
// each "section.key=value" where value is a TOML value; a bare word is taken
// as a string.
job_config load_job_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});
// The same from TOML text; `origin` names it in messages.
job_config parse_job_config(const std::string& text, const std::string& origin,
                            const std::vector<std::string>& overrides = {});

// Checks relations between keys (e.g. nesterov needs momentum); throws config_error.
void validate_job_config(const job_config& config);

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
