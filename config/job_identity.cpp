#include "config/job_identity.hpp"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "config/key_table.hpp"

namespace dpactor {
namespace {

// 64-bit FNV-1a over 8-byte words: enough to tell two copies of a dataset
// apart (not a defence against someone forging one).
std::uint64_t checksum(const void* data, std::size_t bytes, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

std::string describe(const char* what, const dataset& d) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  h = checksum(d.features.data(), d.rows * d.feature_count * sizeof(float), h);
  h = checksum(d.labels.data(), d.rows * sizeof(std::int32_t), h);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return std::string(what) + " " + std::to_string(d.rows) + " x " + std::to_string(d.feature_count) + " (" +
         std::to_string(d.num_classes) + " classes) " + hex;
}

}  // namespace

std::string job_identity(const job_config& config) {
  job_config c = config;
  c.source = job_config{}.source;
  c.data = data_config{};  // each node's own copy, compared by data_fingerprint
  c.cluster = cluster_config{};
  c.train.checkpoint_dir.clear();
  c.faults = faults_config{};
  c.service = service_config{};  // each process's own
  return dump_job_config(c);
}

std::string first_difference(const std::string& mine, const std::string& theirs, const std::string& my_name,
                             const std::string& their_name) {
  std::istringstream a(mine), b(theirs);
  std::string la, lb, section;
  for (;;) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) return "";
    if (more_a && !la.empty() && la.front() == '[') section = la.substr(1, la.find(']') - 1);
    if (more_a && more_b && la == lb) continue;
    const auto key_of = [&](const std::string& line) {
      const auto eq = line.find(" = ");
      return eq == std::string::npos ? line : (section.empty() ? "" : section + ".") + line.substr(0, eq);
    };
    const auto value_of = [](const std::string& line) {
      const auto eq = line.find(" = ");
      return eq == std::string::npos ? std::string("(nothing)") : line.substr(eq + 3);
    };
    if (!more_a) return key_of(lb) + " = " + value_of(lb) + " (" + their_name + ") is missing here (" + my_name + ")";
    if (!more_b) return key_of(la) + " = " + value_of(la) + " (" + my_name + ") is missing in " + their_name;
    return key_of(la) + " = " + value_of(la) + " (" + my_name + ") against " + value_of(lb) + " (" + their_name + ")";
  }
}

std::string data_fingerprint(const dataset& train, const dataset& test) {
  return describe("train", train) + ", " + describe("test", test);
}

}  // namespace dpactor
