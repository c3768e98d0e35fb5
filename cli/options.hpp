#pragma once
// The command line of `dpactor`, parsed into plain values.

#include <optional>
#include <string>
#include <vector>

namespace dpactor::cli {

struct options {
  std::string model;             // --model FILE
  std::string gpus = "all";      // --gpus all|N|LIST
  std::optional<int> cpus;       // --cpus N
  std::vector<std::string> sets; // --set and the dedicated flags, as section.key=value
  std::vector<std::string> inject; // --inject fault specs, added to faults.inject
  std::string resume;            // --resume DIR
  std::string init_from;         // --init-from FILE
  std::string metrics;           // --metrics FILE
  std::string log_level = "info";
  bool quiet = false;
  bool print_config = false;
  bool config_reference = false;
};

// Parses argv. Returns the exit code to end with when parsing ends the program
// (--help, --version, a usage error, which it reports), or nullopt to run.
std::optional<int> parse_options(int argc, char** argv, options& out);

}  // namespace dpactor::cli
