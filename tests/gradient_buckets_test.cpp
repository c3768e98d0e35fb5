// Bucket planning (See Note [Gradient buckets]): last layer first, whole
// tensors, a small first bucket, the cap, and buckets that tile the
// parameter section exactly.

#include <gtest/gtest.h>

#include "comms/gradient_buckets.hpp"
#include "tensors/replica.hpp"

namespace dpactor {
namespace {

state_layout layout_of(std::vector<int> sizes) {
  return make_state_layout(mlp_spec{std::move(sizes), activation::relu, loss_kind::cross_entropy}, optimizer_config{});
}

std::vector<gradient_bucket> plan(const state_layout& l, bucket_limits limits = {}) {
  return plan_gradient_buckets(l.layout, l.parameter_tensors, l.parameter_size, limits);
}

// Buckets follow each other down the layout and cover [0, section) exactly;
// each starts at the offset of its lowest tensor.
void expect_tiling(const state_layout& l, const std::vector<gradient_bucket>& buckets) {
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front().end, l.parameter_size);
  EXPECT_EQ(buckets.back().begin, 0u);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_LT(buckets[b].begin, buckets[b].end);
    EXPECT_EQ(buckets[b].begin, l.layout.tensors()[buckets[b].lowest_tensor].offset);
    if (b > 0) {
      EXPECT_EQ(buckets[b].end, buckets[b - 1].begin);
      EXPECT_LT(buckets[b].lowest_tensor, buckets[b - 1].lowest_tensor) << "last layer first";
    }
  }
}

TEST(GradientBuckets, TheDefaultMlpFitsTheFirstBucket) {
  // 235,146 floats = 0.94 MB < 1 MiB.
  const state_layout l = layout_of({784, 256, 128, 10});
  const auto buckets = plan(l);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].lowest_tensor, 0u);
  expect_tiling(l, buckets);
}

TEST(GradientBuckets, AWideMlpGetsASmallFirstBucketAndCappedOthers) {
  // Tensors 0..9: 0.weight [4096, 784], 0.bias, 2.weight [4096, 4096] (64 MiB), ..., 8.weight [10, 4096], 8.bias.
  const state_layout l = layout_of({784, 4096, 4096, 4096, 4096, 10});
  const auto buckets = plan(l);
  expect_tiling(l, buckets);
  // First: 8.bias, 8.weight, 6.bias (0.17 MB), then 6.weight passes 1 MiB.
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].lowest_tensor, 6u);
  // Each 64 MiB weight passes the 25 MiB cap on its own, with its bias.
  EXPECT_EQ(buckets[1].lowest_tensor, 4u);
  EXPECT_EQ(buckets[2].lowest_tensor, 2u);
  EXPECT_EQ(buckets[3].lowest_tensor, 0u) << "0.weight (12 MiB) and 0.bias end in the last bucket";
}

TEST(GradientBuckets, TheCapClosesABucketOnceItsTensorsReachIt) {
  // Bytes: 0.weight 2048, 0.bias 128, 2.weight 512, 2.bias 16.
  const state_layout l = layout_of({16, 32, 4});
  // First bucket at 16 bytes: 2.bias alone. Cap 600 bytes: 2.weight + 0.bias
  // = 640 bytes closes the second; 0.weight is the last.
  const auto buckets = plan(l, {16, 600});
  expect_tiling(l, buckets);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].lowest_tensor, 3u);
  EXPECT_EQ(buckets[1].lowest_tensor, 1u);
  EXPECT_EQ(buckets[2].lowest_tensor, 0u);
  // A cap of one byte: one bucket per tensor.
  const auto single = plan(l, {1, 1});
  expect_tiling(l, single);
  EXPECT_EQ(single.size(), 4u);
}

TEST(GradientBuckets, BadArgumentsAreErrors) {
  const state_layout l = layout_of({16, 32, 4});
  EXPECT_THROW(plan(l, {0, 1}), std::invalid_argument);
  EXPECT_THROW(plan_gradient_buckets(l.layout, l.layout.tensors().size() + 1, l.parameter_size, {}), std::invalid_argument);
  EXPECT_TRUE(plan_gradient_buckets(l.layout, 0, 0, {}).empty());
}

}  // namespace
}  // namespace dpactor
