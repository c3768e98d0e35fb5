#include "actors/log.hpp"

#include <atomic>
#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

namespace dpactor {
namespace {

// A sink that hands each formatted line (without its newline) to the host.
class handler_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit handler_sink(log_handler handler) : handler_(std::move(handler)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    handler_(level_of(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}

 private:
  static log_level level_of(spdlog::level::level_enum level) {
    switch (level) {
      case spdlog::level::trace: return log_level::trace;
      case spdlog::level::debug: return log_level::debug;
      case spdlog::level::info: return log_level::info;
      case spdlog::level::warn: return log_level::warn;
      case spdlog::level::err: return log_level::error;
      default: return log_level::critical;
    }
  }
  log_handler handler_;
};

spdlog::level::level_enum spdlog_level(log_level level) {
  switch (level) {
    case log_level::trace: return spdlog::level::trace;
    case log_level::debug: return spdlog::level::debug;
    case log_level::info: return spdlog::level::info;
    case log_level::warn: return spdlog::level::warn;
    case log_level::error: return spdlog::level::err;
    case log_level::critical: return spdlog::level::critical;
  }
  return spdlog::level::info;
}

// The host's logger; null: spdlog's default one. Not registered with
// spdlog, so the host's spdlog registry is left as it is.
std::shared_ptr<spdlog::logger> host_logger;

}  // namespace

void set_log_handler(log_handler handler, log_level min_level) {
  std::shared_ptr<spdlog::logger> logger;
  if (handler) {
    logger = std::make_shared<spdlog::logger>("dpactor", std::make_shared<handler_sink>(std::move(handler)));
    logger->set_level(spdlog_level(min_level));
  }
  std::atomic_store(&host_logger, std::move(logger));
}

std::shared_ptr<spdlog::logger> engine_log() {
  if (auto logger = std::atomic_load(&host_logger)) return logger;
  return spdlog::default_logger();
}

}  // namespace dpactor
