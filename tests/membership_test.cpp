// Membership without actors: the choice of the state source after a fault,
// the suspects of a hang from the members' late reports, and the graceful
// changes that wait for a step boundary.

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "train/membership.hpp"

namespace dpactor {
namespace {

membership three() { return membership({{0, "cpu:0"}, {1, "cpu:1"}, {2, "cpu:2"}}, {}); }

// ---- the state source ----

TEST(MemberList, NamesEveryMemberOfASmallGenerationAndTheEndsOfALargeOne) {
  std::vector<std::string> few = {"cpu:0", "cpu:1", "w1/cpu:0"};
  EXPECT_EQ(member_list(few), "cpu:0, cpu:1, w1/cpu:0");
  EXPECT_EQ(member_list({}), "");
  std::vector<std::string> many;
  for (int i = 0; i < 1000; ++i) many.push_back("sim:" + std::to_string(i));
  EXPECT_EQ(member_list(many), "sim:0, sim:1, sim:2, sim:3, sim:4, sim:5, sim:6, sim:7, ... 988 more ..., sim:996, sim:997, "
                               "sim:998, sim:999");
  many.resize(16);
  EXPECT_EQ(member_list(many).find("more"), std::string::npos) << "16 members are listed in full";
  many.resize(17);
  EXPECT_NE(member_list(many).find("... 5 more ..."), std::string::npos);
}

TEST(StateSource, IsTheMostAdvancedSurvivor) {
  const membership m = three();
  const state_source s = m.choose_state_source({{0, 9}, {1, 11}, {2, 10}}, 8, std::nullopt);
  ASSERT_TRUE(s.rank);
  EXPECT_EQ(*s.rank, 1u);
  EXPECT_EQ(s.through, 11);
}

TEST(StateSource, IsTheOldestOnATie) {
  const membership m = three();
  const state_source s = m.choose_state_source({{0, 9}, {1, 10}, {2, 10}}, 8, std::nullopt);
  ASSERT_TRUE(s.rank);
  EXPECT_EQ(*s.rank, 1u) << "ranks 1 and 2 hold step 10: the older one, rank 1";
}

TEST(StateSource, SkipsAMemberBehindTheCommitPoint) {
  // Rank 0 is a newcomer whose broadcast failed: it is behind what is committed.
  const membership m = three();
  const state_source s = m.choose_state_source({{0, 3}, {1, 8}, {2, 8}}, 8, std::nullopt);
  ASSERT_TRUE(s.rank);
  EXPECT_EQ(*s.rank, 1u);
  EXPECT_EQ(s.through, 8);
}

TEST(StateSource, SkipsGoneMembers) {
  membership m = three();
  m.remove(1, "failed: test");
  const state_source s = m.choose_state_source({{0, 9}, {1, 12}, {2, 10}}, 8, std::nullopt);
  ASSERT_TRUE(s.rank);
  EXPECT_EQ(*s.rank, 2u) << "the failed member's own step does not count";
  EXPECT_EQ(s.through, 10);
}

TEST(StateSource, ARescueStateCountsOnlyWithoutASurvivor) {
  membership m = three();
  // A survivor holds step 9; a failed device's last state (the rescue) holds 12.
  state_source s = m.choose_state_source({{0, 9}}, 8, 12);
  ASSERT_TRUE(s.rank);
  EXPECT_EQ(s.through, 9) << "a survivor's state is kept over the rescue";
  // No survivor: the rescue state's step is what the run holds.
  for (std::size_t r = 0; r < 3; ++r) m.remove(r, "failed: test");
  s = m.choose_state_source({}, 8, 12);
  EXPECT_FALSE(s.rank);
  EXPECT_EQ(s.through, 12);
  // A rescue behind the commit point is worthless.
  s = m.choose_state_source({}, 8, 5);
  EXPECT_EQ(s.through, 8);
}

// ---- suspects ----

TEST(Suspects, AreTheMembersMissingFromEveryReportOfTheStep) {
  membership m({{0, "cpu:0"}, {1, "cpu:1"}, {2, "cpu:2"}, {3, "cpu:3"}}, {});
  m.form_generation();
  const std::vector<std::int32_t> first{2, 3}, second{3};
  EXPECT_EQ(m.on_late(5, 0, first, 4), (std::vector<std::int32_t>{2, 3}));
  // Rank 2 arrived by the time rank 1 reported.
  EXPECT_EQ(m.on_late(5, 1, second, 4), (std::vector<std::int32_t>{3}));
  EXPECT_EQ(m.late_suspects(4), (std::vector<std::size_t>{3}));
}

TEST(Suspects, NeverIncludeAMemberThatReportedWaiting) {
  membership m = three();
  m.form_generation();
  const std::vector<std::int32_t> a{1, 2}, b{0, 2};
  m.on_late(5, 0, a, 4);
  m.on_late(5, 1, b, 4);  // rank 1 is waiting itself
  EXPECT_EQ(m.late_suspects(4), (std::vector<std::size_t>{2}));
}

TEST(Suspects, WithoutNamesAreTheMembersNotWaiting) {
  // NCCL cannot tell who is missing: the late reports carry no names.
  membership m = three();
  m.form_generation();
  m.on_late(5, 0, {}, 4);
  EXPECT_EQ(m.on_late(5, 2, {}, 4), (std::vector<std::int32_t>{1}));
  EXPECT_EQ(m.late_suspects(4), (std::vector<std::size_t>{1}));
}

TEST(Suspects, NoSuspectForACommittedStep) {
  membership m = three();
  m.form_generation();
  const std::vector<std::int32_t> missing{2};
  m.on_late(5, 0, missing, 4);
  EXPECT_EQ(m.late_suspects(4).size(), 1u);
  // Step 5 committed since: a stall now is another step's, with no one to blame yet.
  EXPECT_TRUE(m.late_suspects(5).empty());
  EXPECT_TRUE(m.on_late(3, 1, missing, 4).empty()) << "a report of a committed step changes nothing";
}

TEST(Suspects, ANewGenerationForgetsTheOldReports) {
  membership m = three();
  m.form_generation();
  const std::vector<std::int32_t> missing{2};
  m.on_late(5, 0, missing, 4);
  m.form_generation();
  EXPECT_TRUE(m.late_suspects(4).empty());
}

// ---- graceful changes ----

TEST(Changes, PlannedOnesPauseBeforeTheirStepAndPendingOnesAtOnce) {
  fault_spec join;
  join.kind = fault_kind::join;
  join.device = -1;
  join.step = 10;
  membership m({{0, "cpu:0"}, {1, "cpu:1"}}, {join});
  m.form_generation();
  EXPECT_EQ(m.next_pause(3, std::nullopt), 8) << "a change at step 10 (1-based) comes after 0-based step 8";
  m.take_due_changes(7);
  EXPECT_EQ(m.pending_joins(), 0) << "not due yet";
  m.take_due_changes(8);
  EXPECT_EQ(m.pending_joins(), 1);
  EXPECT_EQ(m.next_pause(8, std::nullopt), 8) << "pending: as soon as possible";
  m.admit({2, "cpu:2"});
  EXPECT_EQ(m.form_generation(), "cpu:2 joined");
  EXPECT_EQ(m.generation(), 1);
  EXPECT_EQ(m.members().size(), 3u);
}

TEST(Changes, PlannedChangesPastTheLastStepNeverHappen) {
  fault_spec leave;
  leave.kind = fault_kind::leave;
  leave.device = 1;
  leave.step = 50;
  membership m({{0, "cpu:0"}, {1, "cpu:1"}}, {leave});
  EXPECT_FALSE(m.next_pause(3, 20).has_value());
}

TEST(Changes, TheStateSourceLeavesOnlyAtTheNextBoundary) {
  membership m = three();
  m.form_generation();
  ASSERT_TRUE(m.request_leave("cpu:1"));
  ASSERT_TRUE(m.request_leave("cpu:2"));
  EXPECT_FALSE(m.request_leave("cpu:7"));
  const std::vector<int> left = m.apply_leaves(1);  // cpu:1 is the state source
  EXPECT_EQ(left, std::vector<int>{2});
  EXPECT_EQ(m.members().size(), 2u);
  EXPECT_EQ(m.next_pause(5, std::nullopt), 5) << "cpu:1's leave is still pending";
  EXPECT_EQ(m.apply_leaves(), std::vector<int>{1});
  EXPECT_EQ(m.members().size(), 1u);
}

TEST(Changes, ARemovedMemberKeepsItsRankUntilTheNextGeneration) {
  membership m = three();
  m.form_generation();
  EXPECT_TRUE(m.remove(1, "failed: boom"));
  EXPECT_FALSE(m.remove(1, "failed: again"));
  EXPECT_EQ(m.members().size(), 3u);
  EXPECT_EQ(m.live(), 2u);
  EXPECT_FALSE(m.rank_of(1).has_value());
  EXPECT_EQ(m.rank_of(2), 2u);
  EXPECT_EQ(m.form_generation(), "cpu:1 failed: boom");
  EXPECT_EQ(m.rank_of(2), 1u);
}

}  // namespace
}  // namespace dpactor
