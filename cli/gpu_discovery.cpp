#include "cli/gpu_discovery.hpp"

#include <charconv>
#include <stdexcept>

#include "actors/backend.hpp"

namespace dpactor::cli {
namespace {

int parse_int(const std::string& text, const std::string& spec) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0)
    throw std::invalid_argument("--gpus " + spec + ": expected all, a count N, or a list of device numbers like 0,2");
  return v;
}

}  // namespace

gpu_selection select_gpus(const std::string& spec) {
  gpu_selection out;
  std::vector<int> wanted;
  bool all = spec == "all";
  int count = -1;  // --gpus N
  if (!all) {
    if (spec.find(',') == std::string::npos) {
      count = parse_int(spec, spec);
      if (count == 0) return out;  // --gpus 0: CPU replicas by request
    } else {
      std::size_t start = 0;
      while (start <= spec.size()) {
        const auto comma = spec.find(',', start);
        wanted.push_back(parse_int(spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start), spec));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
  }
  const int visible = usable_gpus(out.note);
  if (all) {
    for (int i = 0; i < visible; ++i) out.devices.push_back(i);
    return out;
  }
  if (visible == 0) return out;  // no GPU at all: the CPU fallback, with out.note
  if (count > visible)
    throw std::invalid_argument("--gpus " + spec + ": " + std::to_string(visible) + " GPU" + (visible == 1 ? "" : "s") +
                                " visible");
  for (int i = 0; i < count; ++i) wanted.push_back(i);
  for (const int d : wanted) {
    if (d >= visible)
      throw std::invalid_argument("--gpus " + spec + ": GPU " + std::to_string(d) + " does not exist (" +
                                  std::to_string(visible) + " visible)");
    out.devices.push_back(d);
  }
  return out;
}

}  // namespace dpactor::cli
