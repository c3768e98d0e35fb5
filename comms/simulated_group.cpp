#include "comms/simulated_group.hpp"

#include <stdexcept>
#include <string>

namespace dpactor {

simulated_group::simulated_group(int size) : size_(size) {
  if (size < 1) throw std::logic_error("simulated_group: " + std::to_string(size) + " members");
  members_.resize(static_cast<std::size_t>(size));
}

void simulated_group::join(int rank, std::function<void(std::int64_t step)> on_complete) {
  if (rank < 0 || rank >= size_)
    throw std::logic_error("simulated_group: rank " + std::to_string(rank) + " of " + std::to_string(size_));
  std::lock_guard lock(mutex_);
  members_[static_cast<std::size_t>(rank)] = std::move(on_complete);
}

std::unique_ptr<collective> simulated_group::endpoint(int) {
  throw std::logic_error("simulated_group: simulated members exchange reports only, no buffers");
}

void simulated_group::abort() {
  // Under the lock: a contribution is complete before the abort or never.
  std::lock_guard lock(mutex_);
  aborted_.store(true, std::memory_order_release);
}

bool simulated_group::contribute(std::int64_t step, int rank, const simulated_contribution& c) {
  if (rank < 0 || rank >= size_)
    throw std::logic_error("simulated_group: rank " + std::to_string(rank) + " of " + std::to_string(size_));
  std::lock_guard lock(mutex_);
  if (aborted_.load(std::memory_order_relaxed)) return false;
  tally& t = steps_[step];
  if (t.has.empty()) {
    const auto n = static_cast<std::size_t>(size_);
    t.has.assign(n, false);
    t.result.compute_s.assign(n, 0.0f);
    t.result.member_samples.assign(n, 0.0f);
    t.result.member_returned.assign(n, 0.0f);
  }
  const auto r = static_cast<std::size_t>(rank);
  if (t.has[r])
    throw std::logic_error("simulated_group: rank " + std::to_string(rank) + " contributed to step " +
                           std::to_string(step) + " twice");
  t.has[r] = true;
  t.result.samples += c.samples;
  t.result.loss_sum += c.loss_sum;
  t.result.correct += c.correct;
  t.result.compute_s[r] = static_cast<float>(c.compute_s);
  t.result.member_samples[r] = static_cast<float>(c.samples);
  t.result.member_returned[r] = static_cast<float>(c.returned);
  if (++t.arrived < size_) return false;
  for (const auto& tell : members_)
    if (tell) tell(step);
  return true;
}

std::optional<simulated_result> simulated_group::take(std::int64_t step, int rank) {
  std::lock_guard lock(mutex_);
  const auto it = steps_.find(step);
  if (it == steps_.end() || it->second.arrived < size_) return std::nullopt;
  simulated_result out;
  const simulated_result& all = it->second.result;
  out.samples = all.samples;
  out.loss_sum = all.loss_sum;
  out.correct = all.correct;
  // Only the first member reports the per-member parts: copying them to
  // every member would cost members^2 a step.
  if (rank == 0) {
    out.compute_s = all.compute_s;
    out.member_samples = all.member_samples;
    out.member_returned = all.member_returned;
  }
  if (++it->second.taken == size_) steps_.erase(it);
  return out;
}

}  // namespace dpactor
