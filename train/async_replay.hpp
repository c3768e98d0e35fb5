#pragma once
// Replaying an asynchronous run (sync.mode = "async") to its bytes, from the
// decisions it recorded (round_decision records, dpactor/events.hpp). Pure
// logic, tested without actors (tests/async_claims_test.cpp); the reducer
// follows it (actors/async_run.cpp).
//
// Note [Async replay]
// An async run's bytes are a function of its config, its data and its
// decisions:
// - worker k's round j starts from k's state after its round j - 1 (the
//   store, keyed by j: Note [Logical workers]) and the global weights of
//   committed round b (its base), and trains its claim (Note [Async
//   claims]); a record names b and the claim of each contribution it
//   decides;
// - a decision merges the contributions it names, each weighing samples /
//   (1 + round - b) (async_weight), sums them by Note [Async merge] and
//   applies the outer step at the rate of the merged samples; or drops the
//   ones it names, whose claims go back.
// So a replay runs every recorded round of every worker, in the worker's
// order, from the recorded base (its global weights are kept until the last
// round that starts from them is handed out), and applies the decisions in
// their order, each as soon as every contribution it names has arrived. The
// clock decides nothing; the bytes are the recorded run's on any number of
// devices (each worker's round is computed alike anywhere, as in the other
// round modes). Rounds the run had in flight when it ended were never
// decided: not recorded, not run. A round lost with its device (Note [Async
// faults]) has a record of its own (`lost`); the worker ran it again, under
// the same round number, and that run is the one decided: a replay gives
// the lost claim back where the record says (the epochs' requeued counts
// follow) and runs nothing for it. A replay records its decisions again, the
// same ones (and, if one of its own devices fails, that loss too).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <dpactor/events.hpp>

namespace dpactor {

class async_replay {
 public:
  // A run's decisions in the order it made them, for `workers` logical
  // workers. Throws std::invalid_argument naming what does not fit: a
  // worker past `workers`, a decision of another round than the one its
  // predecessor leaves open, a contribution from a later round's weights, a
  // worker's rounds not 0, 1, 2 ... each decided once.
  async_replay(std::vector<round_decision_event> decisions, std::size_t workers);

  // Worker k's next recorded round (one it has not been handed yet), or null.
  const round_contribution* next_round(std::size_t worker) const;
  // Worker k was handed its next round.
  void handed_out(std::size_t worker);
  // The last round worker k was handed was lost with its device (a failure
  // in the replay itself): it is handed out again.
  void lost(std::size_t worker);
  // The oldest base of the rounds not handed out yet: the global weights a
  // replay must still keep. numeric_limits::max() when none is left.
  std::int64_t oldest_base() const;

  // The next decision to apply, or null when every one was applied.
  const round_decision_event* next_decision() const;
  void applied();

  std::size_t decisions() const noexcept { return decisions_.size(); }

 private:
  std::vector<round_decision_event> decisions_;
  std::size_t next_decision_ = 0;
  std::vector<std::vector<round_contribution>> rounds_;  // by worker, by worker_round
  std::vector<std::size_t> handed_;                      // by worker: rounds handed out
};

// The round_decision records of a metrics file (JSON Lines; other records
// are skipped). Throws std::runtime_error naming the file, and the line of a
// record that does not parse.
std::vector<round_decision_event> read_round_decisions(const std::string& path);

}  // namespace dpactor
