#pragma once
// SIGINT, SIGTERM and SIGHUP; SIGPIPE is ignored. The handler only writes the signal number to a pipe
// (async-signal-safe); a thread of its own reads the pipe and reacts, so the
// reaction may take locks and send messages. A handler rather than a blocked
// mask, because libraries (OpenBLAS) start threads before main that would
// otherwise take the signal's default action.
// The first signal asks for a graceful stop; a second one ends the process.

#include <atomic>
#include <functional>

namespace dpactor::cli {

class signal_watch {
 public:
  // Installs the handlers; `on_first` runs on the watching thread, and
  // `on_second`, if any, on it too right before a second signal ends the
  // process (128 + the signal), to say so where the run reports.
  void start(std::function<void(int)> on_first, std::function<void(int)> on_second = {});
  int received() const noexcept { return received_.load(); }

 private:
  std::atomic<int> received_{0};
};

}  // namespace dpactor::cli
