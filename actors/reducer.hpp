#pragma once
// The reducer actor: step orchestrator and membership authority. It turns the
// devices' one-way reports into calls on its step book and membership
// (train/step_book.hpp, train/membership.hpp), tells the loader what is
// committed, steers shard sizes and cuts stragglers short, ends generations
// on faults and graceful changes, assembles checkpoints, and decides when the
// run is over. It owns the timers and requests; the book-keeping is in those
// two classes, tested alone. It is never on a step's critical path: devices
// run from shard to shard on their own (See Note [Work flows through the
// loader]).
//
// Note [Generations]
// A generation ends at a step boundary the reducer chooses:
// - gracefully (a device joins or leaves): the loader pauses after a step L,
//   every member finishes L, and the next generation starts at L + 1 from the
//   members' identical state;
// - on a fault (an exception, an exit, a collective that failed, a member
//   silent past the hang timeout): the reducer aborts the group from outside,
//   asks every survivor for the last step it applied, takes the most advanced
//   one (oldest on a tie) as the state source S, commits the steps up to S,
//   and rolls the loader back so that every index of a later step is handed
//   out again. Work lost: the steps in flight, nothing else.
// Every new generation gets a fresh collective group, and its members adopt
// the state source's state by broadcast (Note [Replica state buffer]).

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/protocol.hpp"
#include "actors/run_control.hpp"
#include "config/job_config.hpp"
#include "train/fault_plan.hpp"
#include "train/hang_check.hpp"
#include "train/membership.hpp"
#include "train/step_book.hpp"
#include "train/step_runner.hpp"

namespace dpactor {

struct member_handle {
  device_actor actor;
  int id = 0;
  std::string name;
  std::shared_ptr<device_control> control;
};

struct reducer_setup {
  std::shared_ptr<run_control> control;
  std::vector<member_handle> devices;
  // Spawns a new device with the given id (joins); in-process.
  std::function<member_handle(int id)> spawn_device;
  // The collective group of a generation, for its members' device ids: the
  // ticket its members get (See group_ticket).
  std::function<group_ticket(const std::vector<int>& ids, std::int64_t generation)> make_group;
  // Called whenever the reducer aborts a generation's group (its in-process
  // part, ticket.local, is aborted already): across processes, the nodes
  // abort theirs (actors/coordinator.hpp). May be empty.
  std::function<void(std::int64_t generation, const std::string& why)> abort_remote;
  loader_actor loader;
  checkpoint_writer_actor writer;  // invalid when checkpoints are off
  step_book_setup book;
  straggler_config straggler;
  bool cuts = false;  // late members are cut (cuts_enabled(config))
  std::int64_t min_devices = 1;
  double hang_timeout_s = 0.0;  // 0 = automatic
  double first_step_timeout_s = 300.0;  // See Note [Progress-based hang detection]
  std::vector<fault_spec> membership_faults;  // leave and join specs
  // Device faults (fail:R@S, slow:R:F, ...) for devices spawned in other
  // processes, by their id here: sent to them as they are admitted.
  std::vector<fault_spec> remote_device_faults;
  std::optional<std::int64_t> crash_at;       // fault spec crash:reducer@S: throw as this step commits
  std::chrono::steady_clock::time_point started;
  // Round modes: the logical workers (sync.workers resolved), placed on the
  // members' processes at each generation (See Note [Worker placement]);
  // 0: not a round mode.
  std::size_t logical_workers = 0;
  // Round modes across processes, a node lost: its workers' rounds run again
  // (reproducible mode, See Note [Replaying a lost worker's rounds]), or
  // they restart from their backups (fast mode, See Note [Fast rounds
  // across processes]).
  bool replay_lost_workers = true;
  // Round modes, resumed: every logical worker's state at the first step,
  // worker after worker (See Note [A resume across processes]); empty
  // otherwise.
  std::vector<float> resumed_workers;
};

struct reducer_state {
  using clock = std::chrono::steady_clock;
  enum class phase { running, pausing, recovering, stopping };
  // A checkpoint's parts: the state from a member, the ledger from the loader.
  struct pending_checkpoint {
    std::optional<std::vector<float>> state;
    std::optional<ledger_position> position;
    // Round modes: each logical worker's state (See Note [A checkpoint's
    // logical workers]).
    std::map<std::uint32_t, std::vector<float>> workers;
    bool sent = false;
  };

  reducer_setup setup;
  phase current = phase::running;
  generation_plan plan;
  std::optional<membership> members;
  std::optional<step_book> book;
  std::map<int, member_handle> devices;  // every device ever spawned, by id
  int next_device_id = 0;
  std::vector<double> sent_shares;
  std::vector<std::string> worker_owner;  // round modes: each logical worker's node (See Note [Worker placement])
  // A generation formed whose plan waits for the states of the workers that
  // move to another node (See Note [Moving logical workers]); set while
  // form_generation runs too.
  struct forming_generation {
    membership_event event;
    std::vector<int> ids;  // its members' device ids, by rank
    clock::time_point started{};
    std::vector<std::string> owner;  // each logical worker's node once it starts
    std::map<std::size_t, std::vector<std::uint32_t>> asks;  // member rank -> workers its node gives away
    // Workers lost with their node, each with the member rank that runs its
    // rounds again (See Note [Replaying a lost worker's rounds]).
    std::vector<std::pair<std::uint32_t, std::size_t>> replays;
    std::vector<std::uint32_t> restarts;  // fast mode: workers lost with their node
    std::size_t awaited = 0;  // answers still to come
    std::map<std::uint32_t, std::vector<float>> states;  // arrived, by worker
    std::int64_t gathered_bytes = 0;  // their bytes that crossed to this process
  };
  std::optional<forming_generation> forming;
  std::int64_t moved_state_bytes = 0;  // moved workers' states sent between processes
  // Each logical worker's newest state the reducer has, after which step:
  // the last complete checkpoint's or its move's (See Note [Replaying a lost
  // worker's rounds]); none: the first round's.
  std::map<std::uint32_t, std::pair<std::int64_t, std::vector<float>>> backups;
  std::map<caf::actor_addr, bytes_totals> remote_bytes;  // another process's devices' totals (bytes_msg)
  std::map<caf::actor_addr, std::int64_t> remote_overlapped;  // and their overlapped exchanges

  std::map<std::int64_t, pending_checkpoint> checkpoints;
  std::optional<work_done_msg> work;  // the loader has issued its last step
  std::optional<std::int64_t> final_eval_step;
  std::optional<std::int64_t> last_checkpoint;
  bool eval_outstanding = false;

  // Graceful changes and recovery.
  std::vector<std::shared_ptr<std::promise<std::string>>> join_replies;
  std::deque<member_handle> arrivals;  // devices of workers joined while training, to admit
  std::optional<std::int64_t> pause_point;      // last step before a graceful change
  std::map<int, std::int64_t> suspend_replies;  // device id -> last step applied
  std::set<int> awaiting_suspend;               // device ids
  // Note [One deadline for the suspend requests]
  // After an abort the reducer asks every survivor for its last applied
  // step. Those requests carry no timeout of their own: CAF 0.17's clock
  // finds a request's timeout to cancel by a linear search over all of the
  // actor's pending ones, so a thousand requests with timeouts cost a
  // million steps (docs/scale.md). One deadline for all of them, checked
  // by the tick, removes the members that have not answered by then.
  std::optional<clock::time_point> suspend_deadline;
  double suspend_timeout_s = 0.0;
  std::optional<std::pair<std::int64_t, std::vector<float>>> rescue_state;  // from a failed device
  std::string stop_message;                     // why training is stopping (phase::stopping)
  // Set when a fault ends the run instead of a new generation (a hang that
  // nobody can be blamed for, a non-finite step): why. The recovery still
  // finds the last state every member holds, which becomes the checkpoint.
  std::optional<std::string> ending;
  // The committed step at the last stall nobody could be blamed for (See
  // Note [Progress-based hang detection]).
  std::optional<std::int64_t> unblamed_stall_at;
  // Note [A collective that fails in every generation]
  // A generation whose collective fails with no member lost (a group that
  // cannot form in time: cluster.rendezvous_timeout_s) is retried from the
  // last committed step; the same failure in every new one would loop for
  // ever. Generations that fail in a row at one committed step with no
  // member removed are counted; past max_unblamed_failures the run stops
  // with a checkpoint and says why. A commit or a removed member starts the
  // count again (eight workers killed at once may take several generations
  // to leave, one down message at a time).
  struct {
    std::int64_t at = -2;  // the committed step
    int count = 0;
  } unblamed_failures;
  // Stream mode: the loader waits for records with nothing in flight (no
  // hang can be found then), and when it last stopped waiting.
  bool idle = false;
  clock::time_point idle_ended{};
  bool stop_requested = false;
  bool failed = false;
  // A failed run's error, held while a checkpoint write it started finishes
  // (See Note [A failing run waits for its checkpoint writes]).
  struct {
    std::exception_ptr error;
    clock::time_point deadline{};
  } failing;
  static inline const char* name = "reducer";

  const member_handle& handle(std::size_t rank) const { return devices.at(members->members().at(rank).id); }
};

using reducer_ptr = reducer_actor::stateful_pointer<reducer_state>;

reducer_actor::behavior_type reducer_behavior(reducer_ptr self, reducer_setup setup);

// Generations (reducer_generations.cpp), used by the reducer's handlers.
void form_generation(reducer_ptr self, std::int32_t state_source);
void handle_fault(reducer_ptr self, std::optional<std::size_t> rank, const std::string& reason);
// Ends the run with `why` as the error, after a recovery that finds the last
// state all members hold and writes it as a checkpoint. Never a new generation.
void end_run(reducer_ptr self, const std::string& why);
void request_graceful_change(reducer_ptr self);
void check_pause_complete(reducer_ptr self);
void on_suspend_reply(reducer_ptr self, std::int64_t generation, int id, std::optional<std::int64_t> last_step,
                      const std::string& error);
// The suspend requests' deadline passed: the members that have not answered
// are out (See Note [One deadline for the suspend requests]).
void expire_suspend_requests(reducer_ptr self);
// Steps (reducer.cpp), used by the generation code.
void maybe_finish(reducer_ptr self);
void fail_run(reducer_ptr self, std::exception_ptr error);
// Has the writer write a checkpoint; its answer goes to the step code.
void write_checkpoint(reducer_ptr self, write_checkpoint_msg msg);

}  // namespace dpactor
