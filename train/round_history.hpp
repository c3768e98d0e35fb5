#pragma once
// What a process keeps of the rounds it took part in, so that a logical
// worker lost with another process can be run again here (See Note
// [Replaying a lost worker's rounds]). Pure logic, thread-safe.
//
// Note [Replaying a lost worker's rounds]
// Across processes a logical worker's state lives only in its node's store
// (Note [Worker placement]); a process killed with -9 takes the states of
// its workers after the last committed round t with it. In reproducible
// mode they are rebuilt, not approximated: the reducer keeps a backup of
// every worker's state (each complete checkpoint's, each moved worker's;
// none: the first round's state, which every process has), and a worker's
// round is a function of its state before it, the global parameters the
// round started from, its rows, the round's schedule position and, with
// the int8 codec, every worker's block maxima of the round (its residual's
// scales). Every process records the last two for each round it takes part
// in (this history); the loader keeps each round's shard. So when a node is
// gone, the reducer asks one member of each node the placement gives a lost
// worker to (before the new generation's plan goes out) to run that
// worker's rounds from its backup through t, with the rounds' shards; the
// member installs the backup in its store and runs them as its own rounds
// run, residuals included, writing the worker's state after each. The bytes
// are the ones the dead process had: the run goes on to the bytes of a
// run where nothing died. A replay trains nothing new (its samples were
// committed with the dead process's contribution, whose records arrived
// before its gradients: Note [A remote device's record arrives before its
// gradients]), so it sends no trained record. The history of a round is
// dropped once a checkpoint after it is asked for while another after it
// was asked for before (if the newer does not complete, the older's states
// are the backups), and past `max_bytes`, oldest first; a replay that
// needs a round no longer kept, or a node that joined after the backup's
// round, fails and the run stops with a checkpoint, saying why.

//
// Note [Fast rounds across processes]
// In fast mode (train.reproducible = false) a lost worker is not run again:
// no process keeps a history, and the reducer hands each worker lost with
// its node to the node the placement gives it, with its backup (moved_workers
// ::restart; none: the first round's state). The new node's members restart
// it from that state without what the rounds since have already put into
// the global parameters: its residual and progress are zero, and with
// fragments its own parameters are the global ones just adopted (with no
// samples since an exchange). Its inner optimizer's slots are the backup's,
// older than the dead process's. Like every survivor, it then trains the
// round the kill interrupted, on that round's data, so every sample is
// still in exactly one committed round; what is not reproduced is the
// worker's momentum (and its residual) since the backup. The issue asked
// for the survivors to commit the round without the lost worker and for its
// samples to go back to the epoch; training them in their own round keeps
// the epoch's rounds and the inner schedule as planned, at the cost of the
// interrupted round's computation, which the survivors run again anyway.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace dpactor {

class round_history {
 public:
  // Keeps nothing until keep() says how much: one process needs no replays.
  round_history() = default;
  // Keep up to `max_bytes` of rounds (a run across processes).
  void keep(std::size_t max_bytes);

  // Round `round` started from the global `parameters` (every device's, and
  // a round run again's, are the same bytes: the first is kept).
  void record_start(std::int64_t round, std::span<const float> parameters) { record(starts_, round, parameters); }
  // Round `round`'s block maxima of every worker (the int8 codec's).
  void record_maxima(std::int64_t round, std::span<const float> maxima) { record(maxima_, round, maxima); }
  std::optional<std::vector<float>> start(std::int64_t round) const { return find(starts_, round); }
  std::optional<std::vector<float>> maxima(std::int64_t round) const { return find(maxima_, round); }
  // A checkpoint after step `step` was asked for: the rounds up to the
  // checkpoint asked for before it are no longer needed (if this one does
  // not complete, the backups are the one before's).
  void checkpoint_asked(std::int64_t step);
  std::size_t bytes() const;

 private:
  using rounds = std::map<std::int64_t, std::vector<float>>;
  void record(rounds& into, std::int64_t round, std::span<const float> values);
  std::optional<std::vector<float>> find(const rounds& in, std::int64_t round) const;
  void trim();  // under mutex_
  mutable std::mutex mutex_;
  std::size_t max_bytes_ = 0;
  rounds starts_, maxima_;
  std::size_t bytes_ = 0;
  std::int64_t asked_ = -1;  // the last checkpoint asked for
};

}  // namespace dpactor
