#pragma once
// Reading job configs: TOML syntax in .cfg files, checked against a schema.
// Unknown keys, wrong types and out-of-range values are config_errors that
// name the file, line and column, and the key. `--set section.key=value`
// overrides apply on top of the file with the same checks.

#include <filesystem>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "config/key_table.hpp"

namespace dpactor {

// load_job_config (include/dpactor/job_config.hpp) from TOML text; `origin` names it in messages.
job_config parse_job_config(const std::string& text, const std::string& origin,
                            const std::vector<std::string>& overrides = {});

}  // namespace dpactor
