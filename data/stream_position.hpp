#pragma once
// Where a stream stands, as a checkpoint stores it (See Note [Exactly-once
// offsets], data/record_queue.hpp).

#include <cstdint>
#include <vector>

namespace dpactor {

struct stream_position {
  bool active = false;          // the run trains a stream (train.mode = "stream")
  std::int64_t committed = -1;  // every record fed with a sequence number up to this one is trained; -1: none
  // Also trained, above `committed`: records that went out again after a cut
  // left lower ones to be trained later. A replay skips them. Ascending.
  std::vector<std::int64_t> trained_above;
};

}  // namespace dpactor
