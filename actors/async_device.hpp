#pragma once
// A device of an async run (See Note [Async rounds], actors/async_run.hpp):
// runs one logical worker's round at a time, on request, and sends its
// contribution to the reducer. In a worker process (`reducer` null, See
// Note [Async rounds across processes]) it answers whoever sent the round.

#include <memory>

#include <caf/all.hpp>

#include "actors/device.hpp"
#include "train/device_progress.hpp"

namespace dpactor {

struct async_device_watch;

struct async_device_state {
  std::shared_ptr<device_setup> setup;
  caf::actor reducer;
  std::shared_ptr<async_device_watch> watch;  // its progress, which the reducer reads (in one process)
  bool first_round = true;
  bool remote = false;  // in another process than the reducer (See Note [Async rounds across processes])
  static inline const char* name = "dpactor.async_device";
};

// A device in another process's progress relay (See Note [Async rounds
// across processes]): every 100 ms, the device's progress to the reducer
// when it changed; it ends with the device (linked).
caf::behavior async_progress_relay(caf::event_based_actor* self, caf::actor device,
                                   std::shared_ptr<async_device_watch> watch);

caf::behavior async_device(caf::stateful_actor<async_device_state>* self, std::shared_ptr<device_setup> setup,
                           caf::actor reducer, std::shared_ptr<async_device_watch> watch);

}  // namespace dpactor
