#pragma once
// Records for stream mode (public API; train.mode = "stream"): what a service
// feeds to Engine::feed or lets the engine pull from a record_source. See
// Note [Exactly-once offsets] (data/record_queue.hpp) and docs/service.md.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpactor {

// One streamed sample.
struct record {
  std::int64_t sequence = 0;    // chosen by the caller, increasing, >= 0
  std::int32_t label = 0;       // class, 0 .. classes - 1
  std::vector<float> features;  // the model's input size, finite
};

struct feed_result {
  enum class outcome { done, full, closed };
  // Records consumed from the front of the span given: queued, or skipped.
  std::size_t taken = 0;
  // Of those, skipped as already seen or trained: a sequence number not above
  // the last one fed, or one the resumed checkpoint lists as trained.
  std::size_t skipped = 0;
  // done: all were taken. full: the wait ran out with the queue full; feed
  // the rest again. closed: the stream is closed (end of stream, the run
  // stopped or ended); nothing more is taken.
  outcome status = outcome::done;
};

// Pulled by the engine on its own thread: a service's source of records (a
// consumer of a log or a queue) as an alternative to calling Engine::feed.
class record_source {
 public:
  virtual ~record_source() = default;
  // Called once, before the first pull: every record up to `committed` is
  // trained and in a checkpoint (-1: none). Start from the one after it.
  virtual void seek(std::int64_t committed) { (void)committed; }
  // Appends up to `max` records to `out`; waits at most about 100 ms when
  // none is ready (an empty pull is fine). Returns false at the end of the
  // stream: the run then trains what is queued and ends.
  virtual bool pull(std::vector<record>& out, std::size_t max) = 0;
};

}  // namespace dpactor
