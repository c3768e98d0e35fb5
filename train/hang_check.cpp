#include "train/hang_check.hpp"

#include <algorithm>
#include <cstdio>

namespace dpactor {
namespace {

// The least automatic hang timeout: a micro-batch descheduled on a loaded
// machine must not look like a hang.
constexpr double automatic_timeout_floor_s = 5.0;
// The automatic timeout, in median step times.
constexpr double automatic_timeout_steps = 20.0;

double seconds(device_progress::clock::duration d) { return std::chrono::duration<double>(d).count(); }

double allowed(const device_progress::snapshot& s, const hang_limits& limits) {
  return s.warming ? std::max(limits.timeout_s, limits.first_step_s) : limits.timeout_s;
}

std::string describe(const member_progress& m, device_progress::clock::time_point now) {
  char text[160];
  const auto& s = m.progress;
  if (s.phase == device_phase::data)
    std::snprintf(text, sizeof text, "%s waiting for data for %.1f s", m.name.c_str(), seconds(now - s.since));
  else
    std::snprintf(text, sizeof text, "%s in %.*s of step %lld for %.1f s", m.name.c_str(),
                  static_cast<int>(phase_name(s.phase).size()), phase_name(s.phase).data(),
                  static_cast<long long>(s.step + 1), seconds(now - s.since));
  return text;
}

}  // namespace

std::string_view phase_name(device_phase p) noexcept {
  switch (p) {
    case device_phase::data: return "data";
    case device_phase::forward: return "forward";
    case device_phase::backward: return "backward";
    case device_phase::collective: return "collective";
    case device_phase::optimizer: return "optimizer";
    case device_phase::evaluation: return "evaluation";
  }
  return "?";
}

hang_verdict find_hang(std::span<const member_progress> members, device_progress::clock::time_point now,
                       device_progress::clock::time_point last_commit, const hang_limits& limits,
                       std::span<const std::size_t> late_suspects) {
  hang_verdict v;
  auto last = last_commit;
  v.allowed_s = limits.timeout_s;
  for (const auto& m : members) {
    last = std::max(last, m.progress.since);
    v.allowed_s = std::max(v.allowed_s, allowed(m.progress, limits));
  }
  v.stalled_s = seconds(now - last);
  v.stalled = !members.empty() && v.stalled_s > v.allowed_s;
  if (!v.stalled) return v;
  for (const auto& m : members)
    if (is_own_work(m.progress.phase) && seconds(now - m.progress.since) > allowed(m.progress, limits))
      v.suspects.push_back(m.rank);
  if (v.suspects.empty())
    for (const auto r : late_suspects)
      if (std::any_of(members.begin(), members.end(), [&](const member_progress& m) { return m.rank == r; }))
        v.suspects.push_back(r);
  v.blameable = !v.suspects.empty() && v.suspects.size() < members.size();
  // The error or the removal names the stuck members, or every member when
  // none is stuck in its own work.
  const auto suspected = [&](std::size_t rank) {
    return std::find(v.suspects.begin(), v.suspects.end(), rank) != v.suspects.end();
  };
  for (const auto& m : members)
    if (v.suspects.empty() || suspected(m.rank)) v.where += (v.where.empty() ? "" : ", ") + describe(m, now);
  if (!v.blameable) v.suspects.clear();
  return v;
}

bool stall_possible(device_progress::clock::time_point now, device_progress::clock::time_point last_commit,
                    const hang_limits& limits) {
  return seconds(now - last_commit) > limits.timeout_s;
}

double stalled_alone_s(const device_progress::snapshot& s, device_progress::clock::time_point now,
                       const hang_limits& limits) {
  if (!is_own_work(s.phase)) return 0.0;
  const double stalled = seconds(now - s.since);
  const double allowed = s.warming ? std::max(limits.first_step_s, limits.timeout_s) : limits.timeout_s;
  return stalled > allowed ? stalled : 0.0;
}

double hang_timeout(double configured_s, double median_step_s) {
  if (configured_s > 0.0) return configured_s;
  return std::max(automatic_timeout_floor_s, automatic_timeout_steps * median_step_s);
}

}  // namespace dpactor
