// Which node runs each logical worker across processes (Note [Worker
// placement]): pure logic, no actors.

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace dpactor
