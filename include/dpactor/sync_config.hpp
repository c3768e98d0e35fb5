#pragma once
// The [sync] section of a job config (public API; docs/config.md and
// docs/async.md): how often the replicas exchange what they learned, and
// what they exchange. every_step is data-parallel SGD (one all-reduce of the
// gradients a step); local_sgd and diloco run rounds of `every` inner steps
// per logical worker and exchange once a round; async commits rounds on a
// quorum of workers and a deadline (DESIGN.md, "Rounds").

#include <algorithm>
#include <cstdint>

namespace dpactor {

enum class sync_mode { every_step, local_sgd, diloco, async };
enum class outer_optimizer_kind { nesterov, sgd };
enum class sync_codec { fp32, bf16, int8, powersgd };

struct sync_config {
  sync_mode mode = sync_mode::every_step;
  std::int64_t every = 16;  // H: inner steps of a logical worker per round
  outer_optimizer_kind outer_optimizer = outer_optimizer_kind::nesterov;
  double outer_lr = 0.0;  // 0: the rule of outer_rate() below
  double outer_momentum = 0.9;
  std::int64_t fragments = 1;  // P: streaming, the parameters exchanged in P fragments
  std::int64_t delay = 0;      // 1: a round's exchange is applied one round late
  // With delay = 1: a round's exchange runs while the next round computes
  // (false: between the rounds; the same bytes either way).
  bool overlap = true;
  sync_codec codec = sync_codec::fp32;
  std::int64_t workers = 0;  // K logical workers; 0 = the devices at start
  // codec = powersgd (every_step): the factors' rank, and the first step
  // that is compressed (DDP's matrix_approximation_rank, start_powerSGD_iter).
  std::int64_t powersgd_rank = 4;
  std::int64_t powersgd_start_step = 1000;
  // The inner steps' rate is optimizer.lr / K (the linear scaling rule for an
  // inner batch of B / K samples), so a job keeps its [optimizer] across modes.
  bool scale_inner_lr = true;
  // async (docs/async.md, Note [Async commit]): the fresh-enough
  // contributions that commit a round (0: three quarters of the logical
  // workers, rounded up), the oldest base a contribution may have, in rounds,
  // and the floor of the adaptive deadline.
  std::int64_t quorum = 0;
  std::int64_t max_staleness = 2;
  double grace_ms = 50.0;
  std::int64_t quorum_of(std::int64_t workers) const noexcept {
    return quorum > 0 ? std::min(quorum, workers) : std::max<std::int64_t>(1, (3 * workers + 3) / 4);
  }

  bool rounds() const noexcept { return mode != sync_mode::every_step; }
  // The outer step of diloco's: diloco and async.
  bool outer_step() const noexcept { return mode == sync_mode::diloco || mode == sync_mode::async; }
  // diloco's outer rate: outer_lr if set, else DiLoCo's 0.7 scaled by H / 16
  // below H = 16 (where the paper's step makes the outer momentum amplify
  // short rounds) and halved with the one-round delay (docs/async.md and
  // docs/PERFORMANCE.md, "Rounds", for the runs behind it).
  double outer_rate() const noexcept {
    if (outer_lr > 0.0) return outer_lr;
    const double rate = 0.7 * std::min(1.0, static_cast<double>(every) / 16.0);
    return delay > 0 ? rate / 2.0 : rate;
  }
};

}  // namespace dpactor
