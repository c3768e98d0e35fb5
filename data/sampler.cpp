#include "data/sampler.hpp"

#include <numeric>

#include "tensors/rng.hpp"

namespace dpactor {

std::vector<std::uint32_t> epoch_order(std::size_t samples, std::uint64_t seed, std::int64_t epoch, bool shuffle) {
  std::vector<std::uint32_t> order(samples);
  std::iota(order.begin(), order.end(), 0u);
  if (shuffle) {
    rng gen(seed, static_cast<std::uint64_t>(epoch));
    gen.shuffle(order);
  }
  return order;
}

}  // namespace dpactor
