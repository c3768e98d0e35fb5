#pragma once
// SIGINT and SIGTERM, handled on a thread of their own (sigwait) rather than
// in a signal handler, so that reacting may take locks and send messages.
// The first signal asks for a graceful stop; a second one ends the process.

#include <atomic>
#include <functional>

namespace dpactor::cli {

class signal_watch {
 public:
  // Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
  // later: construct it first thing in main.
  signal_watch();
  // Starts the watching thread; `on_first` runs on it for the first signal.
  void start(std::function<void(int)> on_first);
  int received() const noexcept { return received_.load(); }

 private:
  std::atomic<int> received_{0};
};

}  // namespace dpactor::cli
