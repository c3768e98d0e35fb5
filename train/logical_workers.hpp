#pragma once
// Logical workers of the round modes (sync.mode = "local_sgd" or "diloco"):
// the unit of the algorithm, independent of the devices that run them
// (DESIGN.md, "Rounds"; docs/async.md).
//
// Note [Logical workers]
// A logical worker is an inner optimizer state (its slots and step counter),
// with a codec its residual (Note [Int8 pseudo-gradients]), and its share of
// each round's data (Note [Round data]). A round of worker k
// starts from the global weights at the round's start and k's state after
// its previous round, takes its inner steps with the job's optimizer, and
// contributes n_k x (global - inner weights), n_k the samples it trained:
// the round's pseudo-gradients are these slices' sum in the summation tree
// over worker index (Note [Summation tree]), divided by the round's samples
// by the outer step. A device runs the workers of its slices one after the
// other (stealing a late device's unstarted ones, Note [Stealing slices]);
// which device runs a worker changes nothing in the bytes.
//
// Note [Fragments]
// Streaming DiLoCo (arXiv 2501.18512), sync.fragments = P: the parameter
// section is cut into P contiguous fragments of about equal size
// (fragment_range), and each fragment is exchanged once every H inner steps,
// fragment f at inner step (f + 1) H / P of each round: a step of the engine
// is then H / P inner steps of every worker, and step s exchanges fragment
// s mod P, so one exchange sends a P-th of the parameters. A worker keeps its
// own inner parameters across steps (in its state); at the start of step s it
// takes the global values of the fragment step s - 1 exchanged (with P = 1:
// all of them, plain DiLoCo), and at its end contributes, on fragment
// s mod P only, w_k x (global - inner), w_k the samples it trained since that
// fragment's last exchange (kept in its state, so a short step at an epoch's
// end weighs what the worker trained). Every worker takes part in every
// step, also one whose share of a short step is empty (round_shape::slices):
// it takes no inner step but still contributes what it trained since the
// fragment's last exchange. The update divides the sum by the
// weights' sum (the step header's h_weight) and the outer optimizer updates
// that fragment; the rest of the global state carries over.
//
// The workers' states live in a logical_worker_store, one per process, kept
// by round: a round reads the state its worker wrote for the latest round
// before it, and writes its own. A round that is run again (its generation
// failed) reads the same state and writes the same bytes, and so does a device
// of an ended generation that finishes its round late (a hung one released by
// the abort): a write never removes a newer round. The store keeps the last
// few rounds' states, enough for any round a new generation can restart from
// (a survivor is at most one round behind another). A store holds every
// worker in one process; across processes each holds its own node's (See
// Note [Worker placement]), and reading another's is a logic error, never
// a quiet start from the first round's state.
//
// Note [Delayed rounds]
// sync.delay = 1 (PCCL's one-round-late application): the exchange of round
// r runs while round r + 1's inner steps run, and is applied at round r + 1's
// end. So round r + 1 cannot start from the global weights with round r's
// exchange applied; each worker starts it from the global weights as they
// are (the exchanges up to round r - 1 applied) plus its own progress d_k, what
// its round r added to the weights it started that round from (kept in its
// state, Note [A logical worker's state]):
//   start = global + d_k;  after its inner steps: contribution
//   n_k x (start - inner), and d_k = inner - start.
// The outer optimizer is a delayed SGD (optimizer_config::delayed): its
// "pending" slot holds the round's reduced update (the sum times 1 / the
// samples), and each round's update applies the one the slot held and keeps
// its own; the first round applies zeros. The run's last round applies both
// (a flush, slice_work::flushes), and its workers keep no progress, so the
// final model has every round in it. A round's samples commit with its
// exchange, as without the delay: the update that applies them late is in
// the outer state (optimizer.safetensors' "pending" tensors), which a
// checkpoint holds and a newcomer receives. The arithmetic is the same
// whether the exchange overlaps the next round or not (See Note [Overlapped
// delayed rounds], actors/device.cpp).

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <dpactor/sync_config.hpp>
#include "data/dataset.hpp"
#include "tensors/lr_schedule.hpp"
#include "tensors/replica.hpp"
#include "train/device_progress.hpp"
#include "train/round_history.hpp"
#include "train/slice_work.hpp"
#include "train/step_shard.hpp"
#include "train/worker_state.hpp"

namespace dpactor {

class logical_worker_store {
 public:
  // `workers` logical workers, each starting from `initial` (an inner
  // replica's state without its parameter section: the slots, then the tail).
  logical_worker_store(std::size_t workers, std::vector<float> initial);
  // Resumed: worker k starts from the k-th run of initial.size() / workers
  // floats of `initial`, at round `first_round`.
  logical_worker_store(std::size_t workers, std::span<const float> initial, std::int64_t first_round);

  std::size_t workers() const noexcept { return states_.size(); }
  // Whether this process holds worker k's state (every worker, unless
  // hold_only said otherwise).
  bool holds(std::size_t k) const;
  // This process holds only `workers` (the placement's for its node): the
  // others' states are dropped, and reading them throws std::logic_error.
  void hold_only(std::span<const std::size_t> workers);
  // Worker k's state at the start of round `round`.
  std::vector<float> read(std::size_t k, std::int64_t round) const;
  // The same, once worker k's round `round` - 1 is written (at once for the
  // store's first round), calling waiting() once if it has to wait, and
  // stop() every few milliseconds: nullopt if it says so first. See Note
  // [Overlapped delayed rounds]: a device may start round r + 1 while
  // another still computes round r. (waiting() marks the device's progress
  // as in the collective; marking it at every poll would hide a hung member
  // from Note [Progress-based hang detection], which sees a stall only when
  // nobody marks anything.)
  std::optional<std::vector<float>> read_when_written(std::size_t k, std::int64_t round,
                                                      const std::function<bool()>& stop,
                                                      const std::function<void()>& waiting) const;
  // Every worker's state at the start of round `round`, worker after worker
  // (what a checkpoint after round `round` - 1 holds).
  std::vector<float> read_all(std::int64_t round) const;
  // Worker k's state after round `round`. Rounds after it stay: a round's
  // state is a function of the data and the state before it, so whoever
  // writes it writes the same bytes, and a device of an ended generation
  // that finishes an old round late must not erase newer ones.
  void write(std::size_t k, std::int64_t round, std::vector<float> state);
  // Worker k's state at the start of round `round` is `state`, and no
  // other of its states is kept: a process that is handed the state with
  // each round (See Note [Async rounds across processes]), which may be an
  // older round than one it ran before (the newer one was lost).
  void reset(std::size_t k, std::int64_t round, std::vector<float> state);
  // Worker k moved to this process (See Note [Moving logical workers]): its
  // state at the start of round `round` is `state`, unless this process
  // already holds a state of k at or after that point (another of its
  // devices installed it and may have run the round since: never erased).
  void install(std::size_t k, std::int64_t round, std::vector<float> state);
  // Worker k starts again from the first round's state (See Note
  // [Replaying a lost worker's rounds]: a worker with no backup).
  void install_first(std::size_t k);
  // The first round's state of a worker (a store that was not resumed).
  std::vector<float> first_state() const;

 private:
  // Rounds whose states are kept behind the newest written.
  static constexpr std::int64_t kept_rounds = 3;
  mutable std::mutex mutex_;
  mutable std::condition_variable written_;
  std::int64_t first_round_ = 0;  // the round the store starts at
  std::vector<float> initial_;
  struct kept {
    std::map<std::int64_t, std::vector<float>> rounds;  // the state after each round
    bool pruned = false;  // older rounds were dropped
    bool held = true;     // this process holds the worker
  };
  std::vector<kept> states_;
};

// What a device needs to run logical workers' rounds.
struct round_setup {
  std::int64_t worker_batch = 1;        // B / K: rows of one inner step
  lr_schedule inner_schedule;           // the job's [optimizer] schedule, over inner steps
  // With a codec other than fp32, its error feedback (See Note [Int8
  // pseudo-gradients]): each worker's state ends with its residual, one
  // float a parameter.
  sync_codec codec = sync_codec::fp32;
  bool residual() const noexcept { return codec != sync_codec::fp32; }
  // sync.fragments (See Note [Fragments]): step s exchanges fragment s mod P.
  std::int64_t fragments = 1;
  std::size_t parameters = 0;  // the parameter section's floats, which the fragments split
  // sync.delay = 1 (See Note [Delayed rounds]): each worker starts from the
  // global weights plus its own progress, which it keeps in its state; the
  // run's last step, whose update applies the held exchange too.
  bool delayed = false;
  std::int64_t last_step = -1;
  // The parameters [begin, end) that step `step` exchanges.
  std::pair<std::size_t, std::size_t> fragment(std::int64_t step) const noexcept {
    if (fragments <= 1) return {0, parameters};
    const auto f = static_cast<std::size_t>(((step % fragments) + fragments) % fragments);
    return fragment_range(parameters, static_cast<std::size_t>(fragments), f);
  }
  worker_state_shape state_shape(const state_layout& inner) const noexcept {
    return worker_state_shape::of(inner, residual(), static_cast<std::size_t>(fragments), delayed);
  }
  std::shared_ptr<logical_worker_store> store;
  // What this process keeps of each round for replays (See Note [Replaying
  // a lost worker's rounds]); null: nothing (one process).
  std::shared_ptr<round_history> history;
};

// Runs logical workers' rounds on one device, with its own inner replica.
class logical_worker_runner final : public slice_work {
 public:
  logical_worker_runner(std::unique_ptr<replica> inner, std::shared_ptr<const round_setup> setup);

  const logical_worker_store& store() const noexcept { return *setup_->store; }
  const round_setup& setup() const noexcept { return *setup_; }

  // Slice k of a round's shard is worker k's round, from `model`'s parameters.
  batch_stats compute(const step_shard& shard, std::size_t slice, std::span<const std::uint32_t> rows,
                      const dataset& train, replica& model, std::span<float> out,
                      device_progress& progress) override;

  // Worker k's round `round` over its share `rows`, from the global
  // parameters `global`; writes n_k x (global - inner) into `out` and the
  // worker's new state into the store. `first_position` is the inner
  // schedule's position of the round's first inner step.
  // With a residual, out is n_k x (global - inner) + the worker's residual,
  // and the worker's new state waits for keep_residual().
  batch_stats run(std::size_t k, std::int64_t round, double first_position, std::span<const std::uint32_t> rows,
                  const dataset& train, std::span<const float> global, std::span<float> out,
                  device_progress& progress);

  // Writes worker `slice`'s state after round `step`, its residual
  // `residual`: a round's state is whole or absent in the store, so a device
  // whose exchange failed (an ended generation's) writes nothing.
  void keep_residual(std::int64_t step, std::size_t slice, std::span<const float> residual) override;
  // Worker `slice`'s round `step` was not applied: its state after it is
  // the one it started the round from (written over the one the round
  // wrote, without a residual).
  void discard(std::int64_t step, std::size_t slice) override;
  // See Note [Replaying a lost worker's rounds]: the history.
  void step_starts(std::int64_t step, std::span<const float> state) override;
  void keep_maxima(std::int64_t step, std::span<const float> maxima) override;
  // Worker k's round `shard.step` once more, as it ran in another process:
  // from its state before it in the store, the round's global parameters and
  // maxima from the history, its rows of `shard`; its state after it is
  // written, residual included. Throws std::runtime_error when the history
  // lacks the round. `scratch`: parameter_size floats.
  void replay(std::size_t k, const step_shard& shard, const dataset& train, std::span<float> scratch,
              device_progress& progress);
  // See Note [Fast rounds across processes]: worker k, lost with its
  // process, starts round `round` from `state` (an older state of it, or the
  // first round's) without what is already in the global parameters: no
  // residual, no progress, and with fragments its own parameters are
  // `global`'s, no samples since an exchange.
  void restart(std::size_t k, std::int64_t round, std::vector<float> state, std::span<const float> global);
  // The weight of the last run: the samples since its fragment's last
  // exchange.
  double last_weight() const noexcept override { return weight_; }
  bool flushes(std::int64_t step) const noexcept override { return setup_->delayed && step == setup_->last_step; }
  // See Note [Overlapped delayed rounds]: a round waits for its workers'
  // round before it (another device may still compute it), until `stop`
  // says the generation has ended.
  void wait_for_previous_rounds(std::function<bool()> stop) { stop_ = std::move(stop); }

 private:
  std::unique_ptr<replica> inner_;
  std::shared_ptr<const round_setup> setup_;
  std::function<bool()> stop_;  // set: wait for the round before (See wait_for_previous_rounds)
  std::vector<float> state_;  // scratch: the inner replica's whole state
  double weight_ = 0.0;
  // With a residual: states computed, waiting for keep_residual, by
  // (worker, round). See Note [Overlapped delayed rounds]: keep_residual
  // runs on the exchange's thread while the next round runs.
  std::mutex pending_mutex_;
  std::map<std::pair<std::size_t, std::int64_t>, std::vector<float>> pending_;
};

}  // namespace dpactor
