#include "train/fault_plan.hpp"

#include <charconv>
#include <cmath>

#include <dpactor/error.hpp>
#include "tensors/visible_text.hpp"

namespace dpactor {
namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw config_error("fault spec " + quoted(text) + ": " + why +
                     " (forms: fail:R@S, hang:R@S, slow:R:F[@S], jitter:R:P:MS, leave:R@S, join:cpu@S, perturb:R@S, nan:R@S, stuck:R@S, kill:R@S, "
                     "crash:loader@S, crash:reducer@S)");
}

template <class T>
T number(const std::string& text, const std::string& field, const char* what) {
  T v{};
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
  if (ec != std::errc() || end != field.data() + field.size()) bad(text, std::string(what) + " " + quoted(field) + " is not a number");
  return v;
}

// The most a slow or jitter fault may slow a step: far beyond any test's
// need, and finite (an infinite factor slept for no time at all).
constexpr double max_slow_factor = 10000.0;
constexpr double max_jitter_ms = 3'600'000.0;  // an hour

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

}  // namespace

fault_spec parse_fault_spec(const std::string& text) {
  fault_spec f;
  f.text = text;
  std::string body = text;
  bool has_step = false;
  if (const auto at = text.rfind('@'); at != std::string::npos) {
    f.step = number<std::int64_t>(text, text.substr(at + 1), "step");
    if (f.step < 1) bad(text, "steps count from 1");
    body = text.substr(0, at);
    has_step = true;
  }
  const auto parts = split(body, ':');
  const std::string& kind = parts[0];
  auto need = [&](std::size_t n, bool step) {
    if (parts.size() != n) bad(text, "expected " + std::to_string(n - 1) + " fields after '" + kind + ":'");
    if (step && !has_step) bad(text, "'" + kind + "' needs a step: " + kind + ":...@S");
  };
  if (kind == "join") {
    need(2, true);
    if (parts[1] != "cpu") bad(text, "only CPU devices can join for now: join:cpu@S");
    f.kind = fault_kind::join;
    f.device = -1;
    return f;
  }
  if (kind == "crash") {
    need(2, true);
    if (parts[1] != "loader" && parts[1] != "reducer") bad(text, "crash:loader@S or crash:reducer@S");
    f.kind = fault_kind::crash;
    f.target = parts[1] == "loader" ? crash_target::loader : crash_target::reducer;
    f.device = -1;
    return f;
  }
  if (parts.size() < 2) bad(text, "missing the device number");
  f.device = number<int>(text, parts[1], "device");
  if (f.device < 0) bad(text, "device numbers start at 0");
  if (kind == "fail" || kind == "hang" || kind == "leave" || kind == "perturb" || kind == "nan" || kind == "stuck" ||
      kind == "kill") {
    need(2, true);
    f.kind = kind == "fail"      ? fault_kind::fail
             : kind == "hang"    ? fault_kind::hang
             : kind == "leave"   ? fault_kind::leave
             : kind == "perturb" ? fault_kind::perturb
             : kind == "nan"     ? fault_kind::nan
             : kind == "kill"    ? fault_kind::kill
                                 : fault_kind::stuck;
  } else if (kind == "slow") {
    need(3, false);
    f.kind = fault_kind::slow;
    f.factor = number<double>(text, parts[2], "factor");
    // A fault that could not act would pass for one that did: a factor
    // must slow the device down, by a finite amount.
    if (!(f.factor > 1.0 && f.factor <= max_slow_factor))
      bad(text, "the slow-down factor must be above 1 and at most " + std::to_string(static_cast<int>(max_slow_factor)));
  } else if (kind == "jitter") {
    need(4, false);
    if (has_step) bad(text, "jitter applies to every step; it takes no @S");
    f.kind = fault_kind::jitter;
    f.probability = number<double>(text, parts[2], "probability");
    f.delay_ms = number<double>(text, parts[3], "delay");
    if (!(f.probability > 0.0 && f.probability <= 1.0)) bad(text, "the probability must be above 0 and at most 1");
    if (!(f.delay_ms > 0.0 && f.delay_ms <= max_jitter_ms))
      bad(text, "the delay must be above 0 ms and at most " + std::to_string(static_cast<int>(max_jitter_ms)) + " ms");
  } else {
    bad(text, "unknown fault " + quoted(kind));
  }
  return f;
}

std::vector<fault_spec> parse_fault_specs(const std::vector<std::string>& texts) {
  std::vector<fault_spec> out;
  for (const auto& t : texts) out.push_back(parse_fault_spec(t));
  return out;
}

bool is_device_fault(const fault_spec& f) noexcept {
  return f.kind == fault_kind::fail || f.kind == fault_kind::hang || f.kind == fault_kind::slow ||
         f.kind == fault_kind::jitter || f.kind == fault_kind::perturb || f.kind == fault_kind::nan ||
         f.kind == fault_kind::stuck || f.kind == fault_kind::kill;
}

}  // namespace dpactor
