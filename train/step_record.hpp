#pragma once
// What one step did, as the reducer learns it from the step's reduced header
// (See Note [One step report] in actors/protocol.hpp).

#include <cstdint>
#include <vector>

namespace dpactor {

struct step_record {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  double loss_sum = 0.0;       // the step's, over all members
  std::int64_t correct = 0;    // likewise
  std::int64_t samples = 0;    // likewise
  // train.verify_replicas: the reporting member's state checksum and step
  // counter as it carried them into the step (before the step's gather could
  // make them equal).
  std::uint64_t checksum = 0;
  std::int64_t counter = 0;
  std::vector<float> compute_s;        // per member, rank order
  std::vector<float> member_samples;   // per member
  std::vector<float> member_returned;  // per member: indices returned by a cut
  double lr = 0.0;                     // the learning rate the step applied
  // NaN and infinite gradient values, over all members; with a non-finite
  // loss, a step nobody applied (See Note [Non-finite steps]).
  std::int64_t nonfinite = 0;
  bool applied = true;
};

// The indices a cut member returned from one step: trained later.
struct step_returned {
  std::int64_t step = 0;
  std::vector<std::uint32_t> indices;
};

}  // namespace dpactor
