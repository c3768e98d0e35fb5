#pragma once
// Where dpactor logs (public API). By default every engine in the process
// logs through spdlog's default logger (the dpactor program sets its own); a
// host that logs its own way passes a handler instead, and then dpactor
// writes nothing to spdlog's default logger, nor changes it.

#include <functional>
#include <string_view>

namespace dpactor {

enum class log_level { trace, debug, info, warn, error, critical };

// Called for each line, on the thread that logs it (an engine's or an
// actor's); must not block for long, nor call into the engine.
using log_handler = std::function<void(log_level level, std::string_view message)>;

// From this call on, lines at `min_level` and above go to `handler`, from
// every engine in the process; an empty handler: back to spdlog's default
// logger. Thread-safe.
void set_log_handler(log_handler handler, log_level min_level = log_level::info);

}  // namespace dpactor
