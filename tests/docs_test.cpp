// The docs stay true: every config key the README and docs/ name exists in
// the key table, every test program and test docs/testing.md names exists in
// tests/, and every relative link of a Markdown file resolves. The readers
// are plain functions of the text, so each check is also shown failing on a
// line made wrong on purpose.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/key_table.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;

const fs::path source_dir = DPACTOR_SOURCE_DIR;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The Markdown files a user reads: the README, docs/, the examples'.
std::vector<fs::path> markdown_files() {
  std::vector<fs::path> files{source_dir / "README.md"};
  for (const char* folder : {"docs", "examples"})
    for (const auto& entry : fs::recursive_directory_iterator(source_dir / folder))
      if (entry.path().extension() == ".md") files.push_back(entry.path());
  return files;
}

// What `...` spans hold, in order.
std::vector<std::string> code_spans(const std::string& text) {
  std::vector<std::string> spans;
  static const std::regex span("`([^`\n]+)`");
  for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) spans.push_back((*it)[1]);
  return spans;
}

// The config keys code spans name: a span that is a dotted name alone
// (`schedule.warmup_steps`, `train.epochs=3`), and inside longer spans the
// names whose section is one of the config's (`--set cluster.tls.mode=mutual`).
// Files (`model.cfg`, `trainer.json`) are not keys.
std::vector<std::string> config_keys_named(const std::string& text, const std::set<std::string>& sections) {
  static const std::regex alone(R"(^([a-z_]+)\.([a-z_0-9]+(?:\.[a-z_0-9]+)*)(?:\s*=.*)?$)");
  static const std::regex inside(R"((?:^|[^A-Za-z0-9_./-])([a-z_]+)\.([a-z_0-9]+(?:\.[a-z_0-9]+)*))");
  static const std::set<std::string> file_kinds{"cfg", "toml", "md", "py", "pt", "json", "csv", "cpp", "hpp",
                                                "txt", "gz", "safetensors", "sh", "log", "jsonl", "pem", "so",
                                                "cu", "h", "html", "js", "css", "yaml", "yml", "tmp", "lock",
                                                "png", "svg", "a"};
  // Dotted names of other things: `torch.save` is Python's.
  static const std::set<std::string> not_config{"torch", "np", "std", "os", "sys", "caf", "gloo"};
  const auto a_file = [&](const std::string& rest) {
    const auto last_dot = rest.rfind('.');
    return file_kinds.count(last_dot == std::string::npos ? rest : rest.substr(last_dot + 1)) > 0;
  };
  std::vector<std::string> keys;
  for (const auto& span : code_spans(text)) {
    std::smatch m;
    if (std::regex_match(span, m, alone)) {
      if (!a_file(m[2]) && !not_config.count(m[1])) keys.push_back(std::string(m[1]) + "." + std::string(m[2]));
      continue;
    }
    for (std::sregex_iterator it(span.begin(), span.end(), inside), end; it != end; ++it) {
      const std::string section = (*it)[1], rest = (*it)[2];
      if (sections.count(section) && !a_file(rest)) keys.push_back(section + "." + rest);
    }
  }
  return keys;
}

std::set<std::string> known_keys() {
  std::set<std::string> keys;
  for (const auto& k : config_keys()) keys.insert(k.name);
  return keys;
}

std::set<std::string> known_sections() {
  std::set<std::string> sections;
  for (const auto& k : config_keys()) sections.insert(k.name.substr(0, k.name.find('.')));
  return sections;
}

// A key named in the docs is a key, or a section of keys (`cluster.tls`).
bool is_key(const std::string& name, const std::set<std::string>& keys) {
  if (keys.count(name)) return true;
  const auto next = keys.lower_bound(name + ".");
  return next != keys.end() && next->rfind(name + ".", 0) == 0;
}

// The test programs (tests/*_test.cpp) and the tests in them: "Suite.Name"
// for TEST, TEST_F, TEST_P and TYPED_TEST.
struct known_tests {
  std::set<std::string> programs, suites, tests;
};

known_tests tests_in_tree() {
  known_tests known;
  static const std::regex test(R"(\b(?:TEST|TEST_F|TEST_P|TYPED_TEST)\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  for (const auto& entry : fs::directory_iterator(source_dir / "tests")) {
    if (entry.path().extension() != ".cpp") continue;
    const std::string stem = entry.path().stem().string();
    if (stem.size() > 5 && stem.ends_with("_test")) known.programs.insert(stem);
    const std::string text = read_text(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), test), end; it != end; ++it) {
      known.suites.insert((*it)[1]);
      known.tests.insert(std::string((*it)[1]) + "." + std::string((*it)[2]));
    }
  }
  // Tests that are scripts, not programs: add_test(NAME Suite.Name ...).
  static const std::regex script(R"(add_test\(NAME\s+(\w+)\.(\w+))");
  const std::string cmake = read_text(source_dir / "tests" / "CMakeLists.txt");
  for (std::sregex_iterator it(cmake.begin(), cmake.end(), script), end; it != end; ++it) {
    known.suites.insert((*it)[1]);
    known.tests.insert(std::string((*it)[1]) + "." + std::string((*it)[2]));
  }
  return known;
}

// What a code span names that is not in the tree: a program (`cli_test`), a
// test (`Cli.UsageErrorsExitTwo`, `EveryBackend/InexactSums.AreBitwiseIdentical/gloo_tcp`)
// or a suite's tests (`Hangs.*`).
std::vector<std::string> missing_tests(const std::string& text, const known_tests& known) {
  static const std::regex program(R"(^([a-z0-9_]+_test)$)");
  static const std::regex named(R"(^(?:\w+/)?([A-Z]\w*)\.(\*|\w+)(?:/\w+)?$)");
  std::vector<std::string> missing;
  for (const auto& span : code_spans(text)) {
    // A span may list several, "cli_test (`Cli.*`)" is two spans already.
    std::smatch m;
    if (std::regex_match(span, m, program)) {
      if (!known.programs.count(m[1])) missing.push_back(span);
    } else if (std::regex_match(span, m, named)) {
      const std::string suite = m[1], test = m[2];
      if (!known.suites.count(suite) || (test != "*" && !known.tests.count(suite + "." + test)))
        missing.push_back(span);
    }
  }
  return missing;
}

// Relative links, [text](path) or [text](path#anchor), that name no file or
// folder beside `file`.
std::vector<std::string> broken_links(const std::string& text, const fs::path& folder) {
  static const std::regex link(R"(\]\(([^)\s]+)\))");
  std::vector<std::string> broken;
  for (std::sregex_iterator it(text.begin(), text.end(), link), end; it != end; ++it) {
    std::string target = (*it)[1];
    if (target.find("://") != std::string::npos || target.starts_with("mailto:") || target.starts_with("#")) continue;
    target = target.substr(0, target.find('#'));
    if (!fs::exists(folder / target)) broken.push_back(target);
  }
  return broken;
}

TEST(Docs, EveryConfigKeyTheyNameExists) {
  const auto keys = known_keys();
  const auto sections = known_sections();
  std::size_t named = 0;
  for (const auto& file : markdown_files())
    for (const auto& key : config_keys_named(read_text(file), sections)) {
      ++named;
      EXPECT_TRUE(is_key(key, keys)) << fs::relative(file, source_dir) << " names `" << key
                                     << "`, which is not a config key (dpactor --config-reference lists them)";
    }
  EXPECT_GT(named, 100u) << "the reader found too few keys to be reading the docs";
}

TEST(Docs, EveryTestTheTestingPageNamesExists) {
  const auto known = tests_in_tree();
  const std::string text = read_text(source_dir / "docs" / "testing.md");
  ASSERT_FALSE(text.empty()) << "docs/testing.md is missing";
  for (const auto& name : missing_tests(text, known))
    ADD_FAILURE() << "docs/testing.md names `" << name << "`, which is no test program, suite or test in tests/";
}

TEST(Docs, EveryRelativeLinkResolves) {
  std::size_t files = 0;
  for (const auto& file : markdown_files()) {
    ++files;
    for (const auto& target : broken_links(read_text(file), file.parent_path()))
      ADD_FAILURE() << fs::relative(file, source_dir) << " links to " << target << ", which does not exist";
  }
  EXPECT_GT(files, 5u);
}

// Each reader, on a line made wrong on purpose: the checks above can fail.
TEST(Docs, TheCheckersFindWhatIsWrong) {
  const auto keys = known_keys();
  const auto sections = known_sections();
  const auto named = config_keys_named(
      "set `schedule.warmup_steps` or `optimizer.warmup_step`; `train.epochs=3`, `configs/model.cfg`, `cluster.tls`",
      sections);
  ASSERT_EQ(named, (std::vector<std::string>{"schedule.warmup_steps", "optimizer.warmup_step", "train.epochs",
                                              "cluster.tls"}));
  EXPECT_FALSE(is_key(named[0], keys));
  EXPECT_FALSE(is_key(named[1], keys));
  EXPECT_TRUE(is_key(named[2], keys));
  EXPECT_TRUE(is_key(named[3], keys));

  const auto known = tests_in_tree();
  EXPECT_EQ(missing_tests("`cli_test` (`Cli.UsageErrorsExitTwo`, `Hangs.*`, `EveryBackend/InexactSums.*`), "
                          "`nosuch_test`, `Cli.NoSuchTest`, `NoSuchSuite.*`",
                          known),
            (std::vector<std::string>{"nosuch_test", "Cli.NoSuchTest", "NoSuchSuite.*"}));

  EXPECT_EQ(broken_links("[cli](cli.md#a-run-owns-its-checkpoints), [web](https://example.org), [x](#here), "
                         "[gone](no-such-page.md)",
                         source_dir / "docs"),
            (std::vector<std::string>{"no-such-page.md"}));
}

}  // namespace
}  // namespace dpactor
