#include "cli/progress.hpp"

#include <cmath>

namespace dpactor::cli {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", total / 60, total % 60);
  return buf;
}

progress_printer::progress_printer(std::FILE* out, bool terminal, std::int64_t epochs)
    : out_(out), terminal_(terminal), epochs_(epochs) {}

void progress_printer::on_event(const event& e) {
  if (const auto* s = std::get_if<step_event>(&e)) on_step(*s);
  else if (const auto* p = std::get_if<epoch_event>(&e)) on_epoch(*p);
}

void progress_printer::on_step(const step_event& e) {
  if (!terminal_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  const double done = static_cast<double>(e.step);
  const double eta = e.total_steps > e.step && done > 0 ? elapsed / done * static_cast<double>(e.total_steps - e.step) : 0.0;
  std::fprintf(out_, "\r\033[Kepoch %lld/%lld  step %lld/%lld  %.0f samples/s  loss %.4f  ETA %s",
               static_cast<long long>(e.epoch + 1), static_cast<long long>(epochs_), static_cast<long long>(e.epoch_step),
               static_cast<long long>(e.epoch_steps), e.samples_per_s, e.loss, format_duration(eta).c_str());
  std::fflush(out_);
  line_open_ = true;
}

void progress_printer::on_epoch(const epoch_event& e) {
  if (terminal_) std::fputs("\r\033[K", out_);
  std::fprintf(out_, "epoch %lld/%lld  train loss %.4f acc %.4f", static_cast<long long>(e.epoch + 1),
               static_cast<long long>(epochs_), e.train_loss, e.train_accuracy);
  if (std::isfinite(e.test_accuracy)) std::fprintf(out_, "  test loss %.4f acc %.4f", e.test_loss, e.test_accuracy);
  std::fprintf(out_, "  %.0f samples/s  %.1f s\n", e.samples_per_s, e.seconds);
  std::fflush(out_);
  line_open_ = false;
}

void progress_printer::print_summary(const run_summary& s) {
  if (line_open_) std::fputs("\n", out_);
  std::fprintf(out_, "test accuracy %.4f  test loss %.4f  %.0f samples/s  wall %.1f s  (%lld step%s, %lld epoch%s)\n",
               s.test_accuracy, s.test_loss, s.samples_per_s, s.wall_s, static_cast<long long>(s.steps),
               s.steps == 1 ? "" : "s", static_cast<long long>(s.epochs), s.epochs == 1 ? "" : "s");
  if (s.bytes_sent > 0)
    std::fprintf(out_, "sent %.1f MB by the collectives (largest call %.2f MB)\n", static_cast<double>(s.bytes_sent) / 1e6,
                 static_cast<double>(s.largest_send) / 1e6);
  if (s.overlapped_exchanges > 0)
    std::fprintf(out_, "%lld round exchanges ran during the next round (sync.overlap)\n",
                 static_cast<long long>(s.overlapped_exchanges));
  if (!s.checkpoint.empty()) std::fprintf(out_, "checkpoint: %s\n", s.checkpoint.c_str());
  std::fflush(out_);
  line_open_ = false;
}

}  // namespace dpactor::cli
