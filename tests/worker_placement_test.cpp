// Which node runs each logical worker across processes (Note [Worker
// placement]): pure logic, no actors.

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/step_shard.hpp"
#include "train/straggler.hpp"
#include "train/worker_placement.hpp"

namespace dpactor {
namespace {

std::vector<std::string> owners(std::initializer_list<const char*> names) { return {names.begin(), names.end()}; }

TEST(WorkerPlacement, TheFirstPlacementCutsContiguousRunsSizedByTheNodesDevices) {
  const std::vector<placement_node> even{{"a", 1}, {"b", 1}};
  const worker_placement p = place_workers(8, even, {});
  EXPECT_EQ(p.owner, owners({"a", "a", "a", "a", "b", "b", "b", "b"}));
  ASSERT_EQ(p.moves.size(), 8u);  // every worker is new
  EXPECT_EQ(p.moves[5].from, "");
  EXPECT_EQ(p.moves[5].to, "b");
  const std::vector<placement_node> uneven{{"a", 1}, {"b", 3}};
  // One each, then the other six by devices (1.5 and 4.5: the tie to the first).
  EXPECT_EQ(place_workers(8, uneven, {}).owner, owners({"a", "a", "a", "b", "b", "b", "b", "b"}));
}

TEST(WorkerPlacement, NothingMovesWhileEveryNodeLives) {
  const std::vector<placement_node> nodes{{"a", 1}, {"b", 1}};
  const std::vector<std::string> before = owners({"a", "b", "a", "b"});  // not contiguous, but placed
  const worker_placement p = place_workers(4, nodes, before);
  EXPECT_EQ(p.owner, before);
  EXPECT_TRUE(p.moves.empty());
}

TEST(WorkerPlacement, ADeadNodesWorkersGoToTheLeastLoadedNodesAndNoOtherMoves) {
  const std::vector<placement_node> survivors{{"a", 1}, {"b", 1}};
  const std::vector<std::string> before = owners({"a", "a", "a", "b", "b", "b", "c", "c"});
  const worker_placement p = place_workers(8, survivors, before);
  EXPECT_EQ(p.owner, owners({"a", "a", "a", "b", "b", "b", "a", "b"}));
  ASSERT_EQ(p.moves.size(), 2u);
  EXPECT_EQ(p.moves[0].worker, 6u);
  EXPECT_EQ(p.moves[0].from, "c");
  EXPECT_EQ(p.moves[0].to, "a");
  EXPECT_EQ(p.moves[1].worker, 7u);
  EXPECT_EQ(p.moves[1].to, "b");
  // A node with more devices takes more of them.
  const std::vector<placement_node> weighted{{"a", 1}, {"b", 3}};
  EXPECT_EQ(place_workers(8, weighted, before).owner, owners({"a", "a", "a", "b", "b", "b", "b", "b"}));
}

TEST(WorkerPlacement, ANewcomerTakesItsShareFromTheMostLoadedNodesHighestWorkersFirst) {
  const std::vector<placement_node> nodes{{"a", 1}, {"b", 1}, {"c", 1}};
  const std::vector<std::string> before = owners({"a", "a", "a", "a", "b", "b", "b", "b"});
  const worker_placement p = place_workers(8, nodes, before);
  // Shares 3, 3, 2: c takes a's worker 3, then b's worker 7.
  EXPECT_EQ(p.owner, owners({"a", "a", "a", "c", "b", "b", "b", "c"}));
  ASSERT_EQ(p.moves.size(), 2u);
  EXPECT_EQ(p.moves[0].worker, 3u);
  EXPECT_EQ(p.moves[0].from, "a");
  EXPECT_EQ(p.moves[1].worker, 7u);
  EXPECT_EQ(p.moves[1].from, "b");
  // The same inputs, the same placement.
  EXPECT_EQ(place_workers(8, nodes, before).owner, p.owner);
}

TEST(WorkerPlacement, EveryWorkerHasOneLiveNodeWhateverTheChurn) {
  std::vector<std::string> owner;
  const std::vector<std::vector<placement_node>> history{
      {{"a", 2}, {"b", 1}}, {{"a", 2}, {"b", 1}, {"c", 1}}, {{"b", 1}, {"c", 1}}, {{"c", 1}}, {{"c", 1}, {"d", 4}}};
  for (const auto& nodes : history) {
    owner = place_workers(12, nodes, owner).owner;
    ASSERT_EQ(owner.size(), 12u);
    for (const std::string& o : owner)
      EXPECT_TRUE(std::any_of(nodes.begin(), nodes.end(), [&](const placement_node& n) { return n.name == o; })) << o;
  }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), "d"), 9);  // one each, the other ten by devices: 3 and 9
}

TEST(WorkerPlacement, NoNodeOrANodeWithoutDevicesIsRefused) {
  EXPECT_THROW(place_workers(4, {}, {}), std::invalid_argument);
  const std::vector<placement_node> empty{{"a", 0}};
  EXPECT_THROW(place_workers(4, empty, {}), std::invalid_argument);
  const std::vector<placement_node> one{{"a", 1}};
  const std::vector<std::string> short_list = owners({"a"});
  EXPECT_THROW(place_workers(4, one, short_list), std::invalid_argument);
}

using slice_lists = std::vector<std::vector<std::uint32_t>>;

TEST(WorkerSlices, WithOneNodeTheyAreTheLoadersSplitOfTheRoundsSlices) {
  // Every member on node 0: the contiguous runs split_by_weight gives, rotated
  // by the step, as in every_step.
  const std::vector<std::int32_t> members{0, 0, 0};
  const std::vector<std::int32_t> workers(8, 0);
  const std::vector<double> weights{1.0, 2.0, 1.0};
  for (std::size_t step = 0; step < 5; ++step) {
    const slice_lists got = worker_slices(members, workers, weights, step, 8);
    const std::vector<std::size_t> sizes = split_by_weight(8, weights, step % 3);
    std::uint32_t next = 0;
    for (std::size_t r = 0; r < 3; ++r) {
      std::vector<std::uint32_t> run;
      for (std::size_t i = 0; i < sizes[r]; ++i) run.push_back(next++);
      EXPECT_EQ(got[r], run) << "member " << r << ", step " << step;
    }
  }
}

TEST(WorkerSlices, ANodesWorkersStayOnItsMembersAndRotateOnlyAmongThem) {
  // Members 0 and 2 on node 0, member 1 on node 1; workers 0, 1, 5 on node 0.
  const std::vector<std::int32_t> members{0, 1, 0};
  const std::vector<std::int32_t> workers{0, 0, 1, 1, 1, 0};
  const std::vector<double> even{1.0, 1.0, 1.0};
  EXPECT_EQ(worker_slices(members, workers, even, 0, 6), (slice_lists{{0, 1}, {2, 3, 4}, {5}}));
  EXPECT_EQ(worker_slices(members, workers, even, 1, 6), (slice_lists{{0}, {2, 3, 4}, {1, 5}}));
  // A short round has fewer slices than workers: the missing ones are nobody's.
  EXPECT_EQ(worker_slices(members, workers, even, 0, 3), (slice_lists{{0}, {2}, {1}}));
  // The weights split inside the node (each member keeps one, to stay measured).
  const std::vector<double> slow_first{1.0, 1.0, 9.0};
  EXPECT_EQ(worker_slices(members, workers, slow_first, 0, 6), (slice_lists{{0}, {2, 3, 4}, {1, 5}}));
  const std::vector<std::int32_t> four_on_node_0{0, 0, 1, 1, 1, 0, 0};
  EXPECT_EQ(worker_slices(members, four_on_node_0, slow_first, 0, 7), (slice_lists{{0}, {2, 3, 4}, {1, 5, 6}}));
}

TEST(WorkerSlices, AShardOwnsARunAsItsRangeAndAnythingElseAsItsList) {
  step_shard shard;
  const std::vector<std::uint32_t> run{2, 3, 4}, gaps{0, 1, 5};
  shard.own(run);
  EXPECT_EQ(shard.first_slice, 2u);
  EXPECT_EQ(shard.last_slice, 5u);
  EXPECT_TRUE(shard.own_slices.empty());
  std::vector<std::uint32_t> seen;
  shard.own(gaps);
  shard.for_each_owned([&](std::uint32_t s) { seen.push_back(s); });
  EXPECT_EQ(seen, gaps);
  EXPECT_EQ(shard.first_slice, shard.last_slice);
  shard.own({});
  seen.clear();
  shard.for_each_owned([&](std::uint32_t s) { seen.push_back(s); });
  EXPECT_TRUE(seen.empty());
}

TEST(WorkerSlices, AWorkerOnANodeWithoutMembersOrMismatchedSizesAreRefused) {
  const std::vector<std::int32_t> members{0, 0};
  const std::vector<std::int32_t> workers{0, 1};
  const std::vector<double> even{1.0, 1.0};
  EXPECT_THROW(worker_slices(members, workers, even, 0, 2), std::invalid_argument);
  EXPECT_NO_THROW(worker_slices(members, workers, even, 0, 1));  // worker 1 has no slice in this round
  const std::vector<double> one{1.0};
  EXPECT_THROW(worker_slices(members, workers, one, 0, 1), std::invalid_argument);
  EXPECT_THROW(worker_slices(members, workers, even, 0, 3), std::invalid_argument);
}

}  // namespace
}  // namespace dpactor
