#pragma once
// What the user sees while training: on a terminal, one line per epoch that
// updates in place (step/total, samples/s, loss, ETA); otherwise one plain
// line per epoch. Then a final summary.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <dpactor/events.hpp>

namespace dpactor::cli {

class progress_printer {
 public:
  progress_printer(std::FILE* out, bool terminal, std::int64_t epochs);

  void on_event(const event& e);
  void print_summary(const run_summary& s);

 private:
  void on_step(const step_event& e);
  void on_epoch(const epoch_event& e);

  std::FILE* out_;
  bool terminal_;
  std::int64_t epochs_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

std::string format_duration(double seconds);

}  // namespace dpactor::cli
