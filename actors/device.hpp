#pragma once
// The device actor: a detached actor (its own thread) owning one replica.
// For each shard it runs forward and backward in micro-batches, reports
// `computed` to the reducer *before* entering the collective (so the reducer
// sees who is late), sums gradients and sample counts with the other members,
// applies the optimizer, and reports `step_done`. Nothing on this path waits
// for the reducer: see Note [Work flows through the loader].
//
// Handles (all from the loader, in order):  begin_generation_msg, shard_msg,
// evaluate_msg, snapshot_msg, finish_msg;  from the engine: params_request.

#include <memory>
#include <string>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "comms/collective.hpp"
#include "data/dataset.hpp"
#include "tensors/lr_schedule.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

struct device_setup {
  std::string name;  // "cpu:0", for messages and events
  std::unique_ptr<replica> model;
  std::shared_ptr<const dataset> train;
  std::shared_ptr<const dataset> test;
  lr_schedule schedule;
  collective_options collective;
  bool verify_replicas = false;
};

struct device_state {
  std::shared_ptr<device_setup> setup;
  std::unique_ptr<collective> comm;
  caf::actor reducer;  // from the generation's begin message
  std::int64_t generation = -1;
  std::int32_t rank = -1;
  std::int64_t last_step = -1;  // last step whose update this replica applied
  std::vector<std::uint32_t> eval_rows;
  static inline const char* name = "device";
};

caf::behavior device_actor(caf::stateful_actor<device_state>* self, std::shared_ptr<device_setup> setup);

}  // namespace dpactor
