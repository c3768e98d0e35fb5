// Reading job configs: TOML files, --set overrides, "did you mean".

#include "config/config_file.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "config/schema.hpp"
#include <dpactor/error.hpp>
#include "tensors/visible_text.hpp"

namespace dpactor {
namespace {

using namespace config_schema;

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t prev = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& key) {
  std::string best;
  std::size_t best_distance = 3;
  for (const auto& k : keys()) {
    const std::string full = k.section + "." + k.name;
    const std::size_t d = edit_distance(key, full);
    if (d < best_distance) {
      best_distance = d;
      best = full;
    }
  }
  return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

// "model, data, ...", in documentation order.
std::string section_list() {
  std::string out;
  std::string last;
  for (const auto& k : keys())
    if (k.section != last) {
      out += (out.empty() ? "" : ", ") + k.section;
      last = k.section;
    }
  return out;
}

bool known_section(const std::string& name) {
  return std::any_of(keys().begin(), keys().end(), [&](const key_spec& k) { return k.section == name; });
}

// Whether some key's name goes on under `prefix` ("cluster.tls." for cluster.tls.ca).
bool known_table(const std::string& prefix) {
  return std::any_of(keys().begin(), keys().end(),
                     [&](const key_spec& k) { return (k.section + "." + k.name).rfind(prefix, 0) == 0; });
}

// The keys of `table`, named under `prefix`; a table inside it is a group of
// keys ([cluster.tls], or cluster.tls.ca = ... in [cluster]).
void apply_keys(job_config& config, const std::string& prefix, const toml::table& table) {
  for (const auto& [key_key, value] : table) {
    const std::string key = prefix + "." + std::string(key_key.str());
    const auto it = std::find_if(keys().begin(), keys().end(),
                                 [&](const key_spec& k) { return k.section + "." + k.name == key; });
    if (it != keys().end()) {
      it->read(config, value, key);
    } else if (value.is_table() && known_table(key + ".")) {
      apply_keys(config, key, *value.as_table());
    } else {
      fail_at(value, key, "unknown key" + suggestion(key));
    }
  }
}

void apply_table(job_config& config, const toml::table& root) {
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    if (!known_section(section))
      fail_at(section_node, section, "unknown section [" + visible(section) + "]; sections are " + section_list());
    const toml::table* table = section_node.as_table();
    if (table == nullptr) fail_at(section_node, section, "expected a table [" + section + "], found " + type_name(section_node));
    apply_keys(config, section, *table);
  }
}

void apply_override(toml::table& root, const std::string& assignment) {
  const std::string origin = "--set " + assignment;
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw config_error(visible(origin) + ": expected section.key=value, e.g. --set train.epochs=5");
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  // The key is checked here, against the argument the user typed: once in
  // the tables, an unknown one would have no place to name.
  const std::string full = section + "." + key;
  if (!known_section(section))
    throw config_error(visible(origin) + ": unknown section [" + visible(section) + "]; sections are " +
                       section_list());
  if (std::none_of(keys().begin(), keys().end(), [&](const key_spec& k) { return k.section + "." + k.name == full; }))
    throw config_error(visible(origin) + ": " + visible(full) + ": unknown key" + suggestion(full));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, origin);
  } catch (const toml::parse_error&) {
    // A bare word: take it as a string (which fails only for text that is
    // not UTF-8).
    try {
      parsed = toml::parse("v = " + quote(value), origin);
    } catch (const toml::parse_error& e) {
      throw config_error(visible(origin) + ": the value is neither a TOML value nor a string: " +
                         std::string(e.description()));
    }
    // toml++ prints bytes that are not UTF-8 as other characters.
    if (parsed["v"].value<std::string>() != value)
      throw config_error(visible(origin) + ": the value is neither a TOML value nor a string: it is not UTF-8");
  }
  // A dotted key ("tls.ca") goes into the tables it names.
  toml::table* target = &root;
  std::string rest = section + "." + key;
  for (auto next = rest.find('.'); next != std::string::npos; next = rest.find('.')) {
    const std::string part = rest.substr(0, next);
    rest = rest.substr(next + 1);
    toml::table* inner = (*target)[part].as_table();
    if (inner == nullptr) {
      target->insert_or_assign(part, toml::table{});
      inner = (*target)[part].as_table();
    }
    target = inner;
  }
  target->insert_or_assign(rest, std::move(*parsed.get("v")));
}

}  // namespace

job_config parse_job_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw config_error(visible(origin) + ":" + std::to_string(src.begin.line) + ":" +
                       std::to_string(src.begin.column) + ": malformed TOML: " + visible(e.description()));
  }
  for (const auto& assignment : overrides) apply_override(root, assignment);
  job_config config;
  config.source = origin;
  apply_table(config, root);
  validate_job_config(config);
  return config;
}

namespace {

// A config file as users give it: a file, or a pipe or process
// substitution (--model <(...)), or a link to one; anything else is named
// as what it is.
std::string read_config_text(const std::filesystem::path& path) {
  const std::string name = visible(path.string());
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    struct stat link {};
    if (error == ELOOP) throw config_error(name + ": a loop of symbolic links, not a config file");
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      throw config_error(name + ": a symbolic link to a file that does not exist");
    if (error == ENOENT || error == ENOTDIR) throw config_error(name + ": config file not found");
    throw config_error(name + ": cannot read the config file: " + std::strerror(error));
  }
  if (S_ISDIR(st.st_mode)) throw config_error(name + ": a directory, not a config file");
  if (S_ISSOCK(st.st_mode)) throw config_error(name + ": a socket, not a config file");
  if (S_ISBLK(st.st_mode)) throw config_error(name + ": a block device, not a config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(name + ": cannot read the config file: " + std::strerror(errno));
  // Pipes and character devices have no size: read up to a bound (a config
  // is a few kilobytes; /dev/zero is endless).
  constexpr std::size_t max_config_bytes = std::size_t{16} << 20;
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > max_config_bytes)
      throw config_error(name + ": more than 16 MiB, not a config file");
  }
  if (in.bad()) throw config_error(name + ": cannot read the config file");
  return text;
}

}  // namespace

job_config load_job_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  return parse_job_config(read_config_text(path), path.string(), overrides);
}

}  // namespace dpactor
