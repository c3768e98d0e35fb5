// The int8 codec's arithmetic (Note [Int8 pseudo-gradients]), without
// threads or collectives: the limits keep every sum of the workers' q within
// int8, each q within its limit, and value = scale x q + residual.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "train/int8_codec.hpp"

namespace dpactor {
namespace {

// Plans K workers' values (each a row of n floats), as every member would.
int8_plan plan_of(const std::vector<std::vector<float>>& values) {
  const std::size_t blocks = int8_blocks(values[0].size());
  std::vector<float> maxima(values.size() * blocks);
  for (std::size_t k = 0; k < values.size(); ++k)
    block_maxima(values[k], std::span<float>(maxima).subspan(k * blocks, blocks));
  int8_plan plan;
  plan.build(maxima, values.size());
  return plan;
}

TEST(Int8Codec, TheLimitsOfABlockAddUpToAtMost127AndFollowEachWorkersMaximum) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> scale(0.0f, 1.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t workers = 1 + static_cast<std::size_t>(trial % 9);
    std::vector<float> maxima(workers);
    for (float& m : maxima) m = trial % 3 == 0 ? 1.0f / 3.0f : std::pow(scale(gen), 4.0f);
    int8_plan plan;
    plan.build(maxima, workers);
    int sum = 0;
    for (std::size_t k = 0; k < workers; ++k) {
      EXPECT_GE(plan.limit(k, 0), 0);
      sum += plan.limit(k, 0);
    }
    ASSERT_LE(sum, 127) << "trial " << trial;
    // Each limit is within one of 127 x its share: the scale is used.
    float total = 0.0f;
    for (const float m : maxima) total += m;
    for (std::size_t k = 0; k < workers; ++k) EXPECT_GE(plan.limit(k, 0), 127.0 * maxima[k] / total - 2.0);
  }
}

TEST(Int8Codec, EncodingKeepsEachQWithinItsLimitAndTheResidualIsWhatWasNotSent) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t workers = 4, n = 3 * int8_block + 5;
  std::vector<std::vector<float>> values(workers, std::vector<float>(n));
  for (std::size_t k = 0; k < workers; ++k)
    for (float& v : values[k]) v = normal(gen) * static_cast<float>(k + 1);
  std::fill(values[0].begin(), values[0].begin() + int8_block, 0.0f);  // worker 0's block 0 is zero
  const int8_plan plan = plan_of(values);
  std::vector<std::int8_t> sum(n, 0);
  std::vector<int> exact(n, 0);
  for (std::size_t k = 0; k < workers; ++k) {
    const std::vector<float> original = values[k];
    std::vector<float> residual = values[k];
    std::vector<std::int8_t> alone(n, 0);
    plan.encode(k, residual, alone);
    plan.encode(k, values[k], sum);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = i / int8_block;
      ASSERT_LE(std::abs(int{alone[i]}), plan.limit(k, b)) << "worker " << k << ", value " << i;
      exact[i] += alone[i];
      // value = scale x q + residual, to the float rounding of one product.
      const float rebuilt = plan.scales()[b] * static_cast<float>(alone[i]) + residual[i];
      EXPECT_NEAR(rebuilt, original[i], 1e-6f * (std::fabs(original[i]) + plan.scales()[b])) << "value " << i;
      // Rounding drops at most half a step, unless the limit clipped.
      if (std::abs(int{alone[i]}) < plan.limit(k, b)) EXPECT_LE(std::fabs(residual[i]), 0.5f * plan.scales()[b] * 1.0001f);
    }
    EXPECT_EQ(plan.limit(0, 0), 0) << "a zero block has no share of the scale";
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(int{sum[i]}, exact[i]) << "the int8 sum is the integer sum";
  std::vector<float> decoded(n);
  plan.decode(sum, decoded);
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_EQ(decoded[i], plan.scales()[i / int8_block] * static_cast<float>(exact[i]));
}

TEST(Int8Codec, ABlockThatIsZeroEverywhereSendsNothingAndKeepsNothing) {
  std::vector<std::vector<float>> values(2, std::vector<float>(10, 0.0f));
  const int8_plan plan = plan_of(values);
  std::vector<std::int8_t> sum(10, 0);
  plan.encode(1, values[1], sum);
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(sum[i], 0);
    EXPECT_EQ(values[1][i], 0.0f);
  }
}

}  // namespace
}  // namespace dpactor
