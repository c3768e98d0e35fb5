#pragma once
// One member's part of one step: the sample indices it trains, in the order
// the loader drew them. Across processes only these indices travel; each
// node reads its own copy of the data (DESIGN.md, "The actors").

#include <cstdint>
#include <vector>

namespace dpactor {

struct step_shard {
  std::int64_t step = 0;   // 0-based optimizer step
  std::int64_t epoch = 0;  // 0-based
  std::vector<std::uint32_t> indices;
};

}  // namespace dpactor
