#pragma once
// Where an async run's claims stand, as a checkpoint stores it (See Note
// [Async claims], train/async_claims.hpp; Note [Async checkpoints],
// actors/async_run.hpp).

#include <cstdint>
#include <vector>

namespace dpactor {

// An epoch with samples not all committed: positions [0, next) of its order
// were handed out; of those, the ranges in `returned` (first, count pairs,
// flattened, the next to hand out first) are not trained, and the rest are
// (`committed` of them).
struct async_epoch_position {
  std::int64_t epoch = 0;
  std::int64_t next = 0;
  std::int64_t committed = 0;
  std::vector<std::int64_t> returned;
};

struct async_position {
  bool active = false;                 // the run is sync.mode = "async"
  std::int64_t done = 0;               // epochs before it are all committed
  std::vector<std::int64_t> requeued;  // by epoch: samples given back so far
  std::vector<async_epoch_position> open;
};

}  // namespace dpactor
