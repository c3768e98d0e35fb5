#include "train/memory_estimate.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

constexpr double float_bytes = 4.0;

// A number from the first line of `file` ("max": none).
double read_limit(const char* file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word) || word == "max") return std::numeric_limits<double>::infinity();
  try {
    return std::stod(word);
  } catch (const std::exception&) {
    return std::numeric_limits<double>::infinity();
  }
}

}  // namespace

std::string byte_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char text[64];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

memory_estimate estimate_memory(const memory_inputs& in) {
  memory_estimate e;
  // The state twice (the current one and the one the update writes), the
  // gradients, and reproducible mode's scratch gradient buffers.
  const double state = 2.0 * in.state * float_bytes;
  const double gradients = (1.0 + in.scratch_gradients) * in.parameters * float_bytes;
  // A micro-batch's inputs and labels, and per layer its outputs, the inputs
  // of its activation and two gradient buffers of the widest layer.
  double activations = 0.0;
  if (!in.widths.empty()) {
    const double widest = *std::max_element(in.widths.begin() + 1, in.widths.end());
    double layers = 0.0;
    for (std::size_t l = 1; l < in.widths.size(); ++l) layers += 2.0 * in.widths[l];
    activations = in.micro_batch * (in.widths.front() + 1.0 + layers + 2.0 * widest) * float_bytes;
  }
  e.per_replica = state + gradients + activations;
  e.shared = in.state * float_bytes + in.data_bytes;  // the initial state, the data
  std::ostringstream detail;
  detail << "per replica " << byte_text(e.per_replica) << " (state " << byte_text(state) << ", gradients "
         << byte_text(gradients);
  if (!in.widths.empty())
    detail << ", a micro-batch of " << static_cast<unsigned long long>(in.micro_batch) << " rows "
           << byte_text(activations);
  detail << ") x " << static_cast<unsigned long long>(in.replicas) << " replica" << (in.replicas == 1 ? "" : "s")
         << ", and once " << byte_text(e.shared) << " (data " << byte_text(in.data_bytes) << ")";
  e.detail = detail.str();
  return e;
}

memory_limit available_memory() {
  memory_limit best{std::numeric_limits<double>::infinity(), "no limit found"};
  const auto consider = [&](double bytes, const char* source) {
    if (bytes < best.bytes) best = {bytes, source};
  };
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0;
    std::string unit;
    meminfo >> kib >> unit;
    if (key == "MemAvailable:") consider(kib * 1024.0, "the kernel's MemAvailable");
  }
  const double cgroup_max = read_limit("/sys/fs/cgroup/memory.max");
  if (std::isfinite(cgroup_max))
    consider(std::max(0.0, cgroup_max - read_limit("/sys/fs/cgroup/memory.current")), "the cgroup's memory.max");
  for (const auto& [resource, name] : {std::pair{RLIMIT_AS, "RLIMIT_AS (ulimit -v)"}, std::pair{RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)"}}) {
    rlimit r{};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY) consider(static_cast<double>(r.rlim_cur), name);
  }
  return best;
}

void check_memory(const memory_inputs& in, const memory_limit& limit) {
  const memory_estimate e = estimate_memory(in);
  const double need = e.total(in.replicas);
  if (need <= limit.bytes) return;
  throw config_error("the job needs about " + byte_text(need) + " of memory: " + e.detail + "; this machine has " +
                     byte_text(limit.bytes) + " available (" + limit.source +
                     "): use fewer or narrower layers (model.layers), a smaller train.micro_batch, fewer replicas "
                     "(--cpus, cluster.cpus) or less data");
}

}  // namespace dpactor
