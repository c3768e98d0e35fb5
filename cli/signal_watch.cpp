#include "cli/signal_watch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace dpactor::cli {
namespace {

int pipe_fds[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  (void)!::write(pipe_fds[1], &byte, 1);
  errno = saved;
}

}  // namespace

void signal_watch::start(std::function<void(int)> on_first, std::function<void(int)> on_second) {
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGHUP, &action, nullptr);  // a closed terminal or ssh session: stop with a checkpoint too
  // A reader that went away (`dpactor ... | head`) makes writes fail with
  // EPIPE instead of killing the run without a checkpoint.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
  std::thread([this, on_first = std::move(on_first), on_second = std::move(on_second)] {
    for (;;) {
      unsigned char byte = 0;
      const ssize_t n = ::read(pipe_fds[0], &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1) return;
      const int sig = byte;
      if (received_.exchange(sig) == 0) {
        on_first(sig);
      } else {
        static const char msg[] = "dpactor: second signal, exiting without a checkpoint\n";
        (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
        if (on_second) on_second(sig);
        std::_Exit(128 + sig);
      }
    }
  }).detach();
}

}  // namespace dpactor::cli
