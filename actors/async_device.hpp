#pragma once
// A device of an async run (See Note [Async rounds], actors/async_run.hpp):
// runs one logical worker's round at a time, on request, and sends its
// contribution to the reducer.

#include <memory>

#include <caf/all.hpp>

#include "actors/device.hpp"
#include "train/device_progress.hpp"

namespace dpactor {

struct async_device_watch;

struct async_device_state {
  std::shared_ptr<device_setup> setup;
  caf::actor reducer;
  std::shared_ptr<async_device_watch> watch;  // its progress, which the reducer reads
  bool first_round = true;
  static inline const char* name = "dpactor.async_device";
};

caf::behavior async_device(caf::stateful_actor<async_device_state>* self, std::shared_ptr<device_setup> setup,
                           caf::actor reducer, std::shared_ptr<async_device_watch> watch);

}  // namespace dpactor
