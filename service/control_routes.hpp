#pragma once
// The token-guarded control of a run over HTTP:
//   POST   /checkpoint       a checkpoint at the next step boundary (202)
//   POST   /stop             stop at the next step boundary, with a checkpoint (202)
//   POST   /devices          admit a new CPU device; answers its name (200)
//   DELETE /devices/{name}   remove a device at the next step boundary (202)
//   PUT    /lr               {"lr": 0.01} overrides the schedule's rate from the
//                            next step on; {"lr": null} returns to it (200)
// A body that is not the JSON asked for, or a rate that is not a finite
// positive number, gets 400 and changes nothing; an unknown device 404.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "service/http_route.hpp"

namespace dpactor {

// What the routes do, bound to an engine by the program (no engine here:
// service/ does not depend on actors/).
struct run_controls {
  std::function<void()> checkpoint;
  std::function<void()> stop;
  std::function<std::string()> add_device;                     // the new device's name; throws if not admitted
  std::function<bool(const std::string& name)> remove_device;  // false: no such member
  std::function<void(std::optional<double> lr)> set_lr;        // nullopt: back to the schedule
};

std::vector<http_route> control_routes(run_controls controls);

}  // namespace dpactor
