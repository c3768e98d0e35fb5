#include "cli/signal_watch.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

namespace dpactor::cli {
namespace {

sigset_t watched() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

signal_watch::signal_watch() {
  const sigset_t set = watched();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void signal_watch::start(std::function<void(int)> on_first) {
  std::thread([this, on_first = std::move(on_first)] {
    const sigset_t set = watched();
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (received_.exchange(sig) == 0) {
        on_first(sig);
      } else {
        static const char msg[] = "dpactor: second signal, exiting without a checkpoint\n";
        (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
        std::_Exit(128 + sig);
      }
    }
  }).detach();
}

}  // namespace dpactor::cli
