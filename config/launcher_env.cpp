#include "config/launcher_env.hpp"

#include <cstdlib>
#include <stdexcept>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

constexpr std::uint16_t default_port = 29500;

// A whole non-negative number, or config_error naming the variable.
long long number(const std::string& name, const std::string& value) {
  std::size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || n < 0)
    throw config_error("environment: " + name + "='" + value + "' is not a whole number");
  return n;
}

std::optional<long long> number_of(const environment_lookup& env, const std::string& name) {
  const auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  return number(name, *v);
}

std::uint16_t port_of(const std::string& name, const std::string& value) {
  const long long p = number(name, value);
  if (p > 65535) throw config_error("environment: " + name + "='" + value + "' is not a port (0 to 65535)");
  return static_cast<std::uint16_t>(p);
}

int world_of(long long n, const std::string& name) {
  if (n > 1 << 20) throw config_error("environment: " + name + "=" + std::to_string(n) + " is not a process count");
  return static_cast<int>(n);
}

}  // namespace

std::pair<std::string, std::uint16_t> split_host_port(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw std::invalid_argument(what + " '" + text + "' is not HOST:PORT");
  int port = -1;
  try {
    std::size_t used = 0;
    port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) throw std::invalid_argument(what + " '" + text + "': the port is not a number from 0 to 65535");
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

std::string first_slurm_host(const std::string& nodelist) {
  const auto bad = [&](const std::string& why) {
    return config_error("environment: SLURM_JOB_NODELIST='" + nodelist + "': " + why);
  };
  // The first entry: up to the first comma outside brackets.
  std::string entry;
  int depth = 0;
  for (const char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw bad("a ']' without its '['");
    if (c == ',' && depth == 0) break;
    entry += c;
  }
  if (depth != 0) throw bad("a '[' without its ']'");
  const auto open = entry.find('[');
  if (open == std::string::npos) {
    if (entry.empty()) throw bad("no host");
    return entry;
  }
  const std::string prefix = entry.substr(0, open);
  const auto close = entry.find(']', open);
  if (prefix.empty()) throw bad("no host name before '['");
  // The first item of the range list: "03-05" or "9"; its start, as written
  // (zero padding is part of the name).
  std::string first = entry.substr(open + 1, close - open - 1);
  first = first.substr(0, first.find(','));
  first = first.substr(0, first.find('-'));
  if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
    throw bad("'" + entry.substr(open, close - open + 1) + "' is not a range of numbers");
  return prefix + first + entry.substr(close + 1);
}

std::optional<launcher_role> role_from_environment(const environment_lookup& env) {
  const auto set = [&](const std::string& name) -> std::optional<std::string> {
    auto v = env(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  std::optional<std::uint16_t> own_port;
  if (const auto p = set("DPACTOR_PORT")) own_port = port_of("DPACTOR_PORT", *p);

  if (const auto address = set("DPACTOR_COORDINATOR")) {
    launcher_role r;
    try {
      std::tie(r.host, r.port) = split_host_port(*address, "DPACTOR_COORDINATOR");
    } catch (const std::invalid_argument& e) {
      throw config_error(std::string("environment: ") + e.what());
    }
    r.source = "DPACTOR_COORDINATOR=" + *address;
    return r;
  }

  const auto master = set("MASTER_ADDR");
  const auto master_port = set("MASTER_PORT");
  if (master && master_port) {
    const auto world = number_of(env, "WORLD_SIZE");
    if (!world || *world <= 1) return std::nullopt;
    std::optional<long long> rank = number_of(env, "RANK");
    std::string rank_name = "RANK";
    if (!rank) {
      rank = number_of(env, "GROUP_RANK");
      rank_name = "GROUP_RANK";
    }
    if (!rank) throw config_error("environment: MASTER_ADDR and WORLD_SIZE=" + std::to_string(*world) +
                                  " are set but neither RANK nor GROUP_RANK: which process coordinates is unknown");
    if (*rank >= *world)
      throw config_error("environment: " + rank_name + "=" + std::to_string(*rank) + " is not below WORLD_SIZE=" +
                         std::to_string(*world));
    launcher_role r;
    r.coordinator = *rank == 0;
    r.host = *master;
    const std::uint16_t p = port_of("MASTER_PORT", *master_port);
    const bool agent_store = set("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    if (own_port) r.port = *own_port;
    else if (agent_store) {
      if (p == 65535) throw config_error("environment: MASTER_PORT=65535 leaves no port after torchrun's store (set DPACTOR_PORT)");
      r.port = static_cast<std::uint16_t>(p + 1);
    } else r.port = p;
    r.workers = r.coordinator ? world_of(*world, "WORLD_SIZE") - 1 : 0;
    if (const auto local = number_of(env, "LOCAL_WORLD_SIZE")) r.local_processes = world_of(*local, "LOCAL_WORLD_SIZE");
    r.source = rank_name + "=" + std::to_string(*rank) + ", WORLD_SIZE=" + std::to_string(*world) + ", MASTER_ADDR=" +
               *master + ", MASTER_PORT=" + *master_port +
               (own_port ? ", DPACTOR_PORT=" + std::to_string(*own_port)
                         : agent_store ? " (torchrun's store holds it: dpactor takes the next)" : "");
    return r;
  }

  if (const auto procid = number_of(env, "SLURM_PROCID")) {
    const auto tasks = number_of(env, "SLURM_NTASKS");
    if (!tasks || *tasks <= 1) return std::nullopt;
    if (*procid >= *tasks)
      throw config_error("environment: SLURM_PROCID=" + std::to_string(*procid) + " is not below SLURM_NTASKS=" +
                         std::to_string(*tasks));
    const auto nodelist = set("SLURM_JOB_NODELIST");
    if (!nodelist) throw config_error("environment: SLURM_PROCID is set but SLURM_JOB_NODELIST is not");
    launcher_role r;
    r.coordinator = *procid == 0;
    r.host = first_slurm_host(*nodelist);
    r.port = own_port ? *own_port : master_port ? port_of("MASTER_PORT", *master_port) : default_port;
    r.workers = r.coordinator ? world_of(*tasks, "SLURM_NTASKS") - 1 : 0;
    r.source = "SLURM_PROCID=" + std::to_string(*procid) + ", SLURM_NTASKS=" + std::to_string(*tasks) +
               ", SLURM_JOB_NODELIST=" + *nodelist;
    return r;
  }
  return std::nullopt;
}

environment_lookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

}  // namespace dpactor
