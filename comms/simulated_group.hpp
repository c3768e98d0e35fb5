#pragma once
// A collective group for simulated members (actors/simulated_device.hpp):
// it moves no gradients, only each member's step report, and tells the
// caller when the last member of a step has arrived. The engine's actors
// (reducer, loader, membership, hang detection) then run as they do on real
// devices, at member counts no machine could hold as replicas.
//
// Note [Simulated members]
// A simulated member is a device actor whose compute and collective are
// stand-ins of fixed duration, and whose reports are real: the samples it
// was given, the digest of their indices, the step records the first member
// assembles from every member's report, the progress marks the hang check
// reads. It is event-based (no thread of its own), so thousands fit in one
// process on one scheduler thread. The stand-in collective is this group: a
// step completes when every member has contributed, at which point it
// completes for every member, as the real all-reduce does; an abort before
// that completes it for nobody. Whether a step completed is decided under
// one lock, so a member asked by the reducer for its last applied step after
// an abort (suspend) answers what the collective decided, never a guess.
// Used by bench/scale_bench.cpp and tests/simulated_members_test.cpp; the
// real engine never makes one.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "comms/collective.hpp"

namespace dpactor {

// What one member brings to a step's stand-in all-reduce.
struct simulated_contribution {
  std::int64_t samples = 0;
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  double compute_s = 0.0;
  std::int64_t returned = 0;
};

// The reduced step: sums, and each member's part in rank order (the step
// header's per-member slots, See header_slot).
struct simulated_result {
  std::int64_t samples = 0;
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::vector<float> compute_s, member_samples, member_returned;
};

class simulated_group final : public collective_group {
 public:
  explicit simulated_group(int size);

  int size() const noexcept override { return size_; }
  // No backend behind it: throws std::logic_error.
  std::unique_ptr<collective> endpoint(int rank) override;
  void abort() override;
  bool aborted() const noexcept override { return aborted_.load(std::memory_order_acquire); }

  // Rank `rank` of the generation is told of every step complete for it
  // through `on_complete` (called by the last contributor's thread). Every
  // member joins before it contributes.
  void join(int rank, std::function<void(std::int64_t step)> on_complete);
  // Rank `rank` contributes to `step`. True when it was the last one: the step
  // is complete for every member, and every member's on_complete was called. False while others are missing, and when
  // the group is aborted (the contribution is dropped). Throws
  // std::logic_error for a rank out of range or a second contribution.
  bool contribute(std::int64_t step, int rank, const simulated_contribution& c);
  // The result of a complete step, for rank `rank`, who will not ask again
  // (the per-member parts for rank 0 only); nothing while the step is
  // incomplete. The group forgets a step once
  // every member has taken it.
  std::optional<simulated_result> take(std::int64_t step, int rank);

 private:
  struct tally {
    int arrived = 0;
    int taken = 0;
    std::vector<bool> has;
    simulated_result result;
  };

  const int size_;
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::map<std::int64_t, tally> steps_;
  std::vector<std::function<void(std::int64_t)>> members_;
};

}  // namespace dpactor
