#pragma once
// The HTTP control routes (service/control_routes.hpp) bound to an Engine, so
// that a host serving a run writes no glue:
//
//   o.routes = dpactor::control_routes(dpactor::engine_controls(engine));

#include <dpactor/engine.hpp>
#include "service/control_routes.hpp"

namespace dpactor {

// Each route calls the engine's method of the same name; DELETE
// /devices/{name} of a name that is no member answers 404 (the engine's
// unknown_device error), and a stop or a new rate is logged.
run_controls engine_controls(Engine& engine);

}  // namespace dpactor
