#pragma once
// A simulated device (See Note [Simulated members], comms/simulated_group.hpp):
// the device actor's protocol (device_actor) on an event-based actor whose
// compute is a timer and whose collective is a simulated_group. Its reports
// are the ones a device sends: step records from the first member, the
// indices it trained (trained_event), failures, evaluations, its last
// applied step on a suspend, progress marks for the hang check.
//
// What it does not simulate: cuts and stealing (it never reads the cut step
// or the slice board: a member trains its own slices or shard), replica
// state (checkpoints get an empty state: runs with simulated members write
// none), and the faults jitter, perturb, nan and stuck (refused by
// run_simulated). fail:R@S, hang:R@S and slow:R:F[@S] act as on a device.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <caf/all.hpp>

#include <dpactor/events.hpp>
#include "actors/protocol.hpp"
#include "comms/simulated_group.hpp"
#include "train/fault_plan.hpp"
#include "train/step_runner.hpp"

namespace dpactor {

using computed_atom = caf::atom_constant<caf::atom("simcomp")>;
using exchanged_atom = caf::atom_constant<caf::atom("simxchg")>;

// The device protocol plus the stand-ins' timers: (generation, step).
using simulated_device_actor =
    device_actor::extend<caf::reacts_to<computed_atom, std::int64_t, std::int64_t>,
                         caf::reacts_to<exchanged_atom, std::int64_t, std::int64_t>>;

struct simulated_device_setup {
  int id = 0;
  std::string name;  // "sim:<id>"
  std::shared_ptr<device_control> control = std::make_shared<device_control>();
  std::chrono::microseconds compute{0};   // a step's compute, whatever its samples
  std::chrono::microseconds exchange{0};  // the collective, from the last arrival to every member
  std::vector<fault_spec> faults;         // this device's (fail, hang, slow)
  std::function<void(const trained_event&)> on_trained;  // null: not told
};

struct simulated_device_state {
  // A shard's step, or an evaluation placed between steps (See Note [Work
  // flows through the loader]); `report`: the last step of its message.
  struct work {
    std::variant<step_shard, evaluate_msg> item;
    bool report = false;
  };
  std::shared_ptr<simulated_device_setup> setup;
  std::int64_t generation = -1;
  std::int32_t rank = -1;
  reducer_actor reducer;
  std::shared_ptr<simulated_group> group;
  bool fresh_generation = false;  // no step of this generation started yet
  std::int64_t last_step = -1;    // last step applied
  std::deque<work> queue;
  std::optional<work> current;    // the step being computed or exchanged
  bool exchanging = false;        // current has contributed
  bool hung = false;              // hang:R@S: until the generation is aborted
  std::uint64_t carried = 0;      // what the member carried into current
  std::uint64_t digest = 0;       // of current's trained indices
  simulated_contribution mine;    // to current
  std::vector<step_record> records;
  static inline const char* name = "simulated device";
};

simulated_device_actor::behavior_type simulated_device_behavior(
    simulated_device_actor::stateful_pointer<simulated_device_state> self, std::shared_ptr<simulated_device_setup> setup);

}  // namespace dpactor
