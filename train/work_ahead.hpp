#pragma once
// Note [Work queued ahead across processes]
// A shard reaches a worker process through CAF's network layer, a round trip
// that takes a few fast steps, so the loader keeps more shard messages queued
// ahead of the commits when some members are in other processes (up to
// `prefetch`, 32 there: 2 -> 32 took 2 processes of 1 replica from 19,300 to
// 27,200 samples/s, docs/PERFORMANCE.md). But every step queued is a step a
// membership change, a pause or a stop waits for: 32 steps of 150 ms (65
// processes on 2 cores) made 8 joining workers wait 5 s for the pause. So
// across processes the queue holds about `work_ahead_s` of measured work,
// between 2 messages and `prefetch`; 2 until a step time is measured.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dpactor {

// Shard messages the loader keeps in flight: `prefetch`, or with
// `work_ahead_s` > 0 about that much work (See Note [Work queued ahead
// across processes]). `step_seconds` is the measured time per committed step
// (0: not measured yet).
inline std::int64_t messages_ahead(std::int64_t prefetch, double work_ahead_s, double step_seconds,
                                   std::int64_t steps_per_message) {
  if (work_ahead_s <= 0.0) return prefetch;
  const std::int64_t least = std::min<std::int64_t>(2, prefetch);
  if (step_seconds <= 0.0) return least;
  const double message_s = step_seconds * static_cast<double>(std::max<std::int64_t>(1, steps_per_message));
  const double wanted = std::ceil(work_ahead_s / message_s);
  if (wanted >= static_cast<double>(prefetch)) return prefetch;
  return std::max(least, static_cast<std::int64_t>(wanted));
}

}  // namespace dpactor
