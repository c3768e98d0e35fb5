// Fuzz target: the job config parser (config/config_file.cpp) from text.
// Input: the config file's text; after a NUL byte, one `--set` override per
// line. A config that loads must print (dump_job_config) as text that loads
// back to the same config.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_file.hpp"
#include "fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dpactor;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string text(input.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (!rest.empty()) {
      const std::size_t eol = rest.find('\n');
      overrides.emplace_back(rest.substr(0, eol));
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    }
  }
  fuzz::expect_clear_error<config_error>([&] {
    const job_config config = parse_job_config(text, "fuzz.cfg", overrides);
    const std::string printed = dump_job_config(config);
    job_config back;
    try {
      back = parse_job_config(printed, "dump");
    } catch (const config_error& e) {
      fuzz::finding(std::string("a loaded config prints as text that does not load: ") + e.what() + "\n" + printed);
    }
    fuzz::require(dump_job_config(back) == printed, "a loaded config prints back differently:\n" + printed);
  });
  return 0;
}
