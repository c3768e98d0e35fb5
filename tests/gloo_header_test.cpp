// The header every gloo call opens with, alone (comms/gloo_header.hpp): two
// ranks that called the same thing agree; any other call is named, both
// sides, before any payload moves.

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comms/gloo_header.hpp"

namespace dpactor {
namespace {

using gloo_header::op;

std::vector<std::uint64_t> header(op o, std::uint64_t size, std::uint64_t root, std::vector<std::uint64_t> extras = {}) {
  std::vector<std::uint64_t> h(gloo_header::capacity, 0);
  const std::size_t bytes = gloo_header::write(h, o, size, root, extras);
  EXPECT_EQ(bytes, (gloo_header::fixed_words + extras.size()) * sizeof(std::uint64_t));
  return h;
}

TEST(GlooHeader, TheSameCallOnTwoRanksAgrees) {
  EXPECT_EQ(gloo_header::mismatch(header(op::all_reduce, 7, 0).data(), header(op::all_reduce, 7, 0).data(), 1, 0), "");
  EXPECT_EQ(gloo_header::mismatch(header(op::all_gather, 2, 0, {3, 4}).data(),
                                  header(op::all_gather, 2, 0, {3, 4}).data(), 1, 0),
            "");
}

TEST(GlooHeader, AnotherSizeOrOperationIsNamedWithBothCalls) {
  EXPECT_EQ(gloo_header::mismatch(header(op::all_reduce, 7, 0).data(), header(op::all_reduce, 8, 0).data(), 2, 0),
            "all_reduce: rank 2 called all_reduce with 8 floats (root 0), rank 0 called all_reduce with 7 floats (root 0)");
  EXPECT_EQ(gloo_header::mismatch(header(op::broadcast, 7, 1).data(), header(op::barrier, 0, 0).data(), 1, 3),
            "broadcast: rank 1 called barrier with 0 floats (root 0), rank 3 called broadcast with 7 floats (root 1)");
  EXPECT_EQ(gloo_header::mismatch(header(op::broadcast, 7, 1).data(), header(op::broadcast, 7, 0).data(), 1, 0).empty(),
            false);
}

TEST(GlooHeader, GatherBuffersOfOtherSizesAreNamed) {
  EXPECT_EQ(gloo_header::mismatch(header(op::all_gather, 2, 0, {3, 4}).data(),
                                  header(op::all_gather, 2, 0, {3, 5}).data(), 1, 0),
            "all_gather: rank 1 called all_gather with 2 floats (root 0), buffer sizes 3 5, rank 0 called all_gather "
            "with 2 floats (root 0), buffer sizes 3 4");
}

TEST(GlooHeader, TreeNodesAreEachRanksOwnButTheSizeAndSlicesMustAgree) {
  EXPECT_EQ(gloo_header::mismatch(header(op::reduce_scatter_tree, 10, 8, {1, 2}).data(),
                                  header(op::reduce_scatter_tree, 10, 8, {3}).data(), 1, 0),
            "");
  EXPECT_NE(gloo_header::mismatch(header(op::reduce_scatter_tree, 10, 8, {1}).data(),
                                  header(op::reduce_scatter_tree, 10, 4, {1}).data(), 1, 0),
            "");
}

// See Note [One call a step]: the step header's floats, then each rank's
// own nodes; the header's length must agree, the nodes need not.
TEST(GlooHeader, AStepsHeaderMustHaveOneLengthOnEveryRank) {
  EXPECT_EQ(gloo_header::mismatch(header(op::all_reduce_tree, 10, 8, {2, 11, 12, 1, 2}).data(),
                                  header(op::all_reduce_tree, 10, 8, {2, 13, 14, 3}).data(), 1, 0),
            "");
  EXPECT_EQ(gloo_header::mismatch(header(op::all_reduce_tree, 10, 8, {2, 11, 12, 1}).data(),
                                  header(op::all_reduce_tree, 10, 8, {3, 13, 14, 15, 3}).data(), 1, 0),
            "all_reduce_tree: rank 1 called all_reduce_tree with 10 floats (root 8), a step header of 3 floats, rank 0 "
            "called all_reduce_tree with 10 floats (root 8), a step header of 2 floats");
  // A length the extras cannot hold is not trusted.
  EXPECT_NE(gloo_header::mismatch(header(op::all_reduce_tree, 10, 8, {2, 11, 12}).data(),
                                  header(op::all_reduce_tree, 10, 8, {2, 11}).data(), 1, 0),
            "");
  EXPECT_NE(gloo_header::mismatch(header(op::all_reduce_tree, 10, 8, {0}).data(),
                                  header(op::reduce_scatter_tree, 10, 8, {}).data(), 1, 0),
            "");
}

TEST(GlooHeader, BytesThatAreNotADpactorHeaderAreSaidToBeSo) {
  std::vector<std::uint64_t> junk(gloo_header::capacity, 0x1234);
  EXPECT_EQ(gloo_header::mismatch(header(op::barrier, 0, 0).data(), junk.data(), 1, 0),
            "barrier: rank 1 called something that is not a dpactor collective, rank 0 called barrier with 0 floats "
            "(root 0)");
  // A header claiming more extras than any call may carry is not trusted.
  auto h = header(op::all_gather, 1, 0, {1});
  auto claims = h;
  claims[4] = gloo_header::max_extras + 1;
  EXPECT_NE(gloo_header::mismatch(h.data(), claims.data(), 1, 0), "");
}

}  // namespace
}  // namespace dpactor
