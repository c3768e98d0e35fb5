#pragma once
// The commit rule of bounded-staleness asynchronous rounds (issue "Never
// wait for the slowest"): when a round commits, which contributions it
// merges and with what weight, which it drops. Pure logic: the time is an
// argument, nothing here waits or reads a clock.
//
// Note [Async commit]
// A round opens when the one before it commits. Logical workers contribute
// when they finish their inner steps; a contribution computed from the
// global weights of round b, arriving while round r is open, has staleness
// s = r - b (0: from the weights this round started from).
// - Bound: a contribution with s > max_staleness is dropped, and its
//   samples go back to the epoch (trained later, as a cut slice's are).
// - Commit: as soon as `quorum` of the alive workers (all of them when
//   fewer are alive) have a contribution within the bound, or at the
//   round's deadline if at least one has. The deadline is the median of
//   the recent arrival times (seconds from a round's opening to a
//   contribution) plus `mad_factor` times their median absolute deviation,
//   at least `grace_s`: hivemind's adaptive deadline
//   (learning-at-home/hivemind#676) with Decoupled DiLoCo's grace window as
//   the floor (arXiv 2604.21428). Before any arrival is known, grace_s.
// - Weights: a merged contribution of n samples and staleness s weighs
//   n / (1 + s), and the round's update divides the weighted sum by the
//   merged samples (sum of n), not by the sum of the weights: a stale
//   contribution moves the weights less, by 1 / (1 + s), as the
//   staleness-aware learning rate of Zhang et al., "Staleness-aware
//   Async-SGD for distributed deep learning" (IJCAI 2016, alpha / tau),
//   and a fresh one (s = 0) weighs its samples, as in diloco.
// - A worker contributes at most once to a round; a second contribution of
//   the same worker while the round is open is the caller's error.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace dpactor {

struct async_rule {
  std::size_t quorum = 1;     // sync.quorum: fresh-enough contributions that commit a round
  std::int64_t max_staleness = 1;
  double grace_s = 0.05;      // sync.grace_ms / 1000: the deadline's floor
  double mad_factor = 3.0;    // k: median + k x MAD
  std::size_t window = 32;    // recent arrivals the deadline is computed from
};

struct async_contribution {
  std::size_t worker = 0;
  std::int64_t base_round = 0;  // the round whose global weights it started from
  double samples = 0.0;
};

struct async_decision {
  bool commit = false;
  struct merged {
    std::size_t worker;
    std::int64_t staleness;
    double samples;
    double weight;  // samples / (1 + staleness)
  };
  std::vector<merged> merged;             // in arrival order
  std::vector<async_contribution> dropped;  // past the bound: their samples go back to the epoch
  double samples = 0.0;                   // the merged samples: what the weighted sum is divided by
};

// A merged contribution's weight: samples / (1 + staleness). (A replay
// recomputes it from the record: See Note [Async replay].)
inline double async_weight(double samples, std::int64_t staleness) noexcept {
  return samples / (1.0 + static_cast<double>(staleness));
}

class async_commit {
 public:
  explicit async_commit(async_rule rule);

  const async_rule& rule() const noexcept { return rule_; }

  // An arrival `seconds` after its round opened, for the deadline.
  void record_arrival(double seconds);
  // The deadline of a round, in seconds from its opening.
  double deadline_s() const;

  // Round `round`, open for `open_s` seconds, with `alive` workers alive and
  // the contributions `arrived` (in arrival order) waiting: commit or not,
  // and what. Drops are reported whether or not the round commits.
  async_decision decide(std::int64_t round, std::span<const async_contribution> arrived, std::size_t alive,
                        double open_s) const;

 private:
  async_rule rule_;
  std::deque<double> arrivals_;
};

}  // namespace dpactor
