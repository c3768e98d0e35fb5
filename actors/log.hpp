#pragma once
// The logger the engine and its actors write to: the host's handler
// (include/dpactor/log.hpp, set_log_handler) or, without one, spdlog's
// default logger.

#include <memory>

#include <spdlog/spdlog.h>

#include <dpactor/log.hpp>

namespace dpactor {

std::shared_ptr<spdlog::logger> engine_log();

}  // namespace dpactor
