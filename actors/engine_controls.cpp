#include "actors/engine_controls.hpp"
#include "actors/log.hpp"


namespace dpactor {

run_controls engine_controls(Engine& engine) {
  return run_controls{
      [&engine] { engine.request_checkpoint(); },
      [&engine] {
        engine_log()->warn("POST /stop: stopping at the next step boundary and writing a checkpoint");
        engine.stop();
      },
      [&engine] { return engine.add_device(); },
      [&engine](const std::string& name) {
        try {
          engine.remove_device(name);
          return true;
        } catch (const error& e) {
          if (e.code() == error_kind::unknown_device) return false;
          throw;
        }
      },
      [&engine](std::optional<double> lr) {
        engine.set_lr(lr);
        if (lr) engine_log()->info("PUT /lr: learning rate {} from the next step on", *lr);
        else engine_log()->info("PUT /lr: the schedule's learning rate from the next step on");
      },
  };
}

}  // namespace dpactor
