#pragma once
// sync.mode = "async" in one process (docs/async.md, "Asynchronous rounds";
// DESIGN.md, "Rounds"): a reducer that commits rounds on a quorum and a
// deadline (actors/async_run.cpp), and device actors that each run one
// logical worker's round at a time, on request, and never wait for each
// other (actors/async_device.cpp); their messages: actors/async_messages.hpp.
//
// Note [Async rounds]
// The round modes' pipeline ends every round in one collective that all
// members enter; async cannot, since a round commits without the late
// workers. So contributions travel one by one, to the reducer, which holds
// the global model (the outer optimizer's replica):
// - The reducer gives a device a worker's round: the worker, its round
//   counter (its state's key in the store, Note [Logical workers]), the
//   global parameters of the newest committed round (a shared, read-only
//   buffer: no copy in one process), and a claim of n_k samples (Note [Async
//   claims]).
// - The device runs it (logical_worker_runner::run: the worker's inner
//   steps from those parameters with its own inner state) and sends back
//   n_k (global_b - inner_k), the stats of its inner steps and the seconds
//   it took.
// - At each arrival and at the open round's deadline (a delayed message to
//   itself) the reducer asks the commit rule (Note [Async commit]). A dropped
//   contribution's claim goes back (trained later in the epoch); a commit
//   adds the merged contributions by Note [Async merge], applies the outer
//   step to the global model (at a rate that follows the round's samples,
//   ibid.), commits the merged claims and opens the next
//   round with the new parameters.
// - A worker whose contribution waits in the open round is not given another
//   round until that round commits (a worker contributes at most once to a
//   round); every other worker with a free device is given its next round at
//   once, from the newest parameters. Each worker stays on its device while
//   there is one per worker.
// - A worker's inner steps per round follow its measured throughput (its
//   rounds' samples over their seconds, smoothed by straggler.smoothing):
//   async_inner_steps.
// What travels is counted as in the other modes' bytes_sent: a round's
// parameters to the device and its contribution back, 4 bytes a float each.
// Each decision is recorded, and a run can follow a record instead of the
// clock (See Note [Async replay], train/async_replay.hpp).
//
// Note [Async rounds across processes]
// With a coordinator (dpactor --coordinator), the reducer runs in its
// process, and a worker process (dpactor --join) offers async devices
// (actors/async_device.cpp, answering whoever sends a round) instead of
// step devices; they join before the start or at any time during training
// (node_joined_msg, through coordinator_role::attach_async) and take free
// workers as a local device does. A worker process holds no logical
// worker: a round for a device there carries the round's global parameters
// and the worker's state at its start (async_remote_round_msg), and the
// contribution comes back with the worker's state after the round
// (async_remote_contribution_msg), which the reducer writes to its store.
// So every worker's state is in the coordinator's store, as in one
// process: a worker process killed with -9 loses only its rounds in flight
// (the reducer monitors its devices; CAF's connection reports them down),
// which Note [Async faults] gives back as any lost round; checkpoints,
// resume (on any mix of processes) and replay are the one-process ones,
// with the same bytes. The price is a worker's state (the inner
// optimizer's slots, p floats for SGD with momentum) each way, beside the
// parameters and the contribution, all counted in bytes_sent. The floats
// travel as their bytes (Note [Floats cross the network as their bytes]).
// A process's loss is seen by the connection's heartbeats
// (cluster.heartbeat_ms, cluster.connection_timeout_ms); a device hung in a
// process that still answers, by its progress: a relay in its process
// (async_progress_relay) sends it whenever it changed (async_progress_msg,
// every 100 ms at most), and the reducer's watch of the device follows it,
// so Note [Async faults]'s hang check sees a remote device as a local one
// (its process silent altogether: no report after its round was handed
// out). Its faults (fail, hang, slow, kill) come as inject_msg; kill:R@S
// kills its process (SIGKILL) at its first round from S - 1 committed
// rounds. Its own record (train.record_trained) travels as trained_event.
//
// Note [Async checkpoints]
// A checkpoint is taken between two messages of the reducer, right after a
// commit (every train.checkpoint_every rounds, at the end, at stop() and
// below cluster.min_devices), while devices may be training: it holds what
// the committed rounds made and nothing undecided. So:
// - model and optimizer: the global replica (the outer optimizer's state)
//   after `round` commits; trainer.json's step is `round`;
// - each worker's state at the start of its first round not decided (in
//   flight or waiting in the open round; else its next round), read from
//   the store (a round writes the state after it, never over the one
//   before);
// - the claims (trainer.json "async": per open epoch, the positions handed
//   out, those committed, and the ranges not trained), with the claims of
//   the undecided rounds given back: a resumed run trains them again, so
//   every sample of an epoch is in one committed contribution across both
//   runs.
// A resume (on any number of devices) starts every worker's next round from
// the checkpoint's global weights, numbered from `round` (the store holds
// the states at that round), and goes on claiming where the claims stood.
// The kept global weights of older rounds are not saved: no contribution
// is stale across a resume. The decisions up to the checkpoint are
// (decisions.jsonl, the metrics stream's round_decision records): replayed,
// they end at the checkpoint with its model and optimizer bytes (a replay
// runs from a run's start, so a resumed run's checkpoints hold the
// decisions since its resume, which replay nothing on their own).
//
// Note [Async faults]
// The reducer watches every device (a CAF monitor). A device that ends on
// its own has failed (fail:R@S: at its first round from S - 1 committed
// rounds or more): its round in flight is lost. Its claim goes back to the
// front of its epoch (trained later in the epoch, as a dropped
// contribution's), the worker's round counter goes back to that round, and
// a record says so (round_decision.lost). Nothing else needs undoing: a
// round writes its worker's state to the store only when it ends, so the
// worker's next round starts from the state the lost one started from, on
// whichever device is free (a device runs one round at a time; with more
// workers than live devices, the free worker with the fewest rounds). The
// commit rule counts the workers alive (running or waiting), so a lost
// round does not hold the quorum; the deadline ends a round in any case.
// A hung device is found on its own (stalled_alone_s, train/hang_check.hpp:
// in its own work without progress past the hang timeout; the others go on
// committing, so the run as a whole never stalls) and given up on as a
// failed one (hang:R@S blocks a round until then).
// leave:R@S: the device gets no new round once round S - 1 is next, and
// leaves when its round in flight is in (merged or dropped as any other).
// join:cpu@S: a new device, with the next number, takes free workers from
// then on. Below cluster.min_devices live devices the run fails, naming the
// device. Every sample of an epoch is still committed once: a claim is
// committed by a merge, or given back (dropped or lost), never both.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/checkpoint_writer.hpp"
#include "actors/launch.hpp"
#include "actors/run_control.hpp"
#include "train/async_replay.hpp"

namespace dpactor {

struct async_run {
  caf::actor reducer;              // takes start_atom, stop_atom
  std::vector<caf::actor> devices;
  caf::actor writer;               // the checkpoint writer, if train.checkpoint_dir is set
};

// What the run records in its first decision, and the record it follows
// instead of the clock (See Note [Async replay]).
struct async_record {
  std::string job;   // job_identity(config)
  std::string data;  // data_fingerprint(train, test)
  std::optional<async_replay> replay;
};

// Spawns the run's actors in `system` (nothing starts before the reducer
// gets start_atom). The outcome and the events go through `control`.
// With `writer_setup`, checkpoints (See Note [Async checkpoints]).
async_run spawn_async_run(caf::actor_system& system, const job_config& config, std::shared_ptr<const launch_plan> plan,
                          std::shared_ptr<run_control> control, std::chrono::steady_clock::time_point started,
                          async_record record, std::shared_ptr<const checkpoint_writer_setup> writer_setup);

}  // namespace dpactor
