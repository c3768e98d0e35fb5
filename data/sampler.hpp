#pragma once
// The order in which an epoch visits the samples: a permutation drawn from
// (seed, epoch) alone, so any process, and a resumed run, recomputes it.

#include <cstdint>
#include <vector>

namespace dpactor {

std::vector<std::uint32_t> epoch_order(std::size_t samples, std::uint64_t seed, std::int64_t epoch, bool shuffle);

}  // namespace dpactor
