// Note [Same-machine ranks share memory], its parts alone: a message larger
// than a ring streams through it whole and in order; a receive of another
// length is refused; a segment opens only with its nonce; a dead process's
// segment is swept and a live one's kept.

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comms/shm_segment.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Runs a transfer to completion, sleeping on `bell` when the ring is stuck.
void run(shm_transfer& t, shm_doorbell& bell) {
  const auto give_up = clock_type::now() + 30s;
  while (!t.complete()) {
    const std::uint32_t seen = bell.seq.load();
    if (!t.advance()) bell.wait(seen, clock_type::now() + 10ms);
    ASSERT_LT(clock_type::now(), give_up) << "the transfer did not finish";
  }
}

// Two messages back to back on the ring from rank 1 to rank 0 of a group of
// `ranks`: 3.5 rings, then 13 bytes.
void expect_streamed_whole_and_in_order(int ranks) {
  auto receiver = shm_segment::create(ranks);
  auto sender = shm_segment::create(ranks);
  auto receivers_view = shm_segment::open(receiver->name(), receiver->nonce(), ranks);  // as the sender maps it
  ASSERT_NE(receivers_view, nullptr);
  std::vector<std::byte> first(shm_ring_bytes(ranks) * 7 / 2), second(13);
  for (std::size_t i = 0; i < first.size(); ++i) first[i] = static_cast<std::byte>(i * 131 + 7);
  for (std::size_t i = 0; i < second.size(); ++i) second[i] = static_cast<std::byte>(200 - i);
  std::vector<std::byte> got_first(first.size()), got_second(second.size());
  std::thread producer([&] {
    for (auto* m : {&first, &second}) {
      shm_transfer t;
      t.ring = &receivers_view->ring_from(1);
      t.other = &receivers_view->doorbell();
      t.data = m->data();
      t.bytes = m->size();
      t.send = true;
      t.peer = 0;
      run(t, sender->doorbell());
    }
  });
  for (auto* m : {&got_first, &got_second}) {
    shm_transfer t;
    t.ring = &receiver->ring_from(1);
    t.other = &sender->doorbell();
    t.data = m->data();
    t.bytes = m->size();
    t.peer = 1;
    run(t, receiver->doorbell());
  }
  producer.join();
  EXPECT_EQ(std::memcmp(got_first.data(), first.data(), first.size()), 0);
  EXPECT_EQ(got_second, second);
}

TEST(ShmSegment, MessagesLargerThanTheRingStreamThroughItWholeAndInOrder) { expect_streamed_whole_and_in_order(2); }

TEST(ShmSegment, TheSmallerRingsOfALargeGroupStreamTheSame) {
  ASSERT_LT(shm_ring_bytes(65), shm_ring_bytes(2));
  expect_streamed_whole_and_in_order(65);
}

// A segment is reserved whole when it is made: 1 MiB rings up to 8 ranks,
// then an inbox of about 8 MiB, never rings under 64 KiB.
TEST(ShmSegment, RingsShrinkAsTheGroupGrowsSoThatAnInboxStaysSmall) {
  EXPECT_EQ(shm_ring_bytes(2), std::size_t{1} << 20);
  EXPECT_EQ(shm_ring_bytes(8), std::size_t{1} << 20);
  EXPECT_EQ(shm_ring_bytes(9), std::size_t{512} << 10);
  EXPECT_EQ(shm_ring_bytes(65), std::size_t{64} << 10);
  EXPECT_EQ(shm_ring_bytes(1000), std::size_t{64} << 10);
  auto segment = shm_segment::create(65);
  struct stat st{};
  const std::string path = "/dev/shm" + segment->name();
  ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
  EXPECT_LT(st.st_size, 9 << 20) << "65 rings of 64 KiB and their headers";
  EXPECT_GE(st.st_size, 65 << 16);
}

// Messages to one peer posted at once, each larger than the ring: a later
// one may not start while an earlier one is on the ring, though the receiver
// frees room between the transfers' turns (it drains on the other core
// while the sender writes). Rounds of it, so that the race shows.
TEST(ShmExchange, MessagesPostedTogetherToOnePeerArriveWholeAndInOrder) {
  auto inbox0 = shm_segment::create(2);
  auto inbox1 = shm_segment::create(2);
  std::vector<std::unique_ptr<shm_segment>> peers0(2), peers1(2);
  peers0[1] = shm_segment::open(inbox1->name(), inbox1->nonce(), 2);
  peers1[0] = shm_segment::open(inbox0->name(), inbox0->nonce(), 2);
  ASSERT_TRUE(peers0[1] && peers1[0]);
  shm_exchange receiver(0, std::move(inbox0), std::move(peers0));
  shm_exchange sender(1, std::move(inbox1), std::move(peers1));
  const shm_health health{nullptr, [](int) {}, std::chrono::milliseconds(5)};
  // Four messages of 2.5, 1.5, 3.25 and 1 rings and a few bytes, each its own pattern.
  std::vector<std::vector<std::byte>> sent;
  for (const std::size_t quarters : {10, 6, 13, 4}) {
    std::vector<std::byte> m(shm_ring_bytes(2) * quarters / 4 + sent.size() + 1);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<std::byte>(i * (29 + 2 * sent.size()) + sent.size());
    sent.push_back(std::move(m));
  }
  for (int round = 0; round < 100; ++round) {
    std::vector<std::vector<std::byte>> got;
    for (const auto& m : sent) got.emplace_back(m.size());
    std::string sender_error;
    std::thread producer([&] {
      try {
        for (auto& m : sent) sender.post(m.data(), m.size(), 0, true);
        sender.drive(shm_exchange::all, clock_type::time_point::max(), clock_type::now() + 30s, health);
      } catch (const std::exception& e) {
        sender_error = e.what();
      }
      sender.clear();
    });
    std::string receiver_error;
    try {
      for (auto& m : got) receiver.post(m.data(), m.size(), 1, false);
      receiver.drive(shm_exchange::all, clock_type::time_point::max(), clock_type::now() + 30s, health);
    } catch (const std::exception& e) {
      receiver_error = e.what();
    }
    receiver.clear();
    producer.join();
    ASSERT_EQ(receiver_error, "") << "round " << round << ": the messages were interleaved on the ring";
    ASSERT_EQ(sender_error, "") << "round " << round;
    for (std::size_t k = 0; k < sent.size(); ++k)
      ASSERT_EQ(std::memcmp(got[k].data(), sent[k].data(), sent[k].size()), 0) << "round " << round << ", message " << k;
  }
}

TEST(ShmSegment, AReceiveOfAnotherLengthIsRefusedUnlessItOnlyBoundsIt) {
  auto segment = shm_segment::create(2);
  shm_doorbell& bell = segment->doorbell();
  std::vector<std::byte> eight(8, std::byte{1}), into(12);
  shm_transfer send{&segment->ring_from(1), &bell, eight.data(), eight.size(), true, true, 0};
  ASSERT_TRUE(send.advance());
  ASSERT_TRUE(send.complete());
  shm_transfer exact{&segment->ring_from(1), &bell, into.data(), into.size(), false, true, 1};
  EXPECT_THROW(exact.advance(), std::length_error) << "8 bytes where 12 were expected";
  // The same message again, received by a transfer that only bounds it (a header).
  shm_transfer again{&segment->ring_from(0), &bell, eight.data(), eight.size(), true, true, 0};
  ASSERT_TRUE(again.advance());
  shm_transfer bounded{&segment->ring_from(0), &bell, into.data(), into.size(), false, false, 1};
  EXPECT_TRUE(bounded.advance());
  EXPECT_TRUE(bounded.complete());
  EXPECT_EQ(bounded.length, 8u);
}

TEST(ShmSegment, OpensOnlyWithItsNonceAndGroupSize) {
  auto segment = shm_segment::create(3);
  EXPECT_NE(shm_segment::open(segment->name(), segment->nonce(), 3), nullptr);
  EXPECT_EQ(shm_segment::open(segment->name(), segment->nonce() + 1, 3), nullptr);
  EXPECT_EQ(shm_segment::open(segment->name(), segment->nonce(), 4), nullptr);
  EXPECT_EQ(shm_segment::open("/not-ours", segment->nonce(), 3), nullptr);
  segment->unlink();
  EXPECT_EQ(shm_segment::open(segment->name(), segment->nonce(), 3), nullptr) << "unlinked: no one else can open it";
}

TEST(ShmSegment, ADeadProcesssSegmentIsSweptAndALiveOnesKept) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // now a pid of no process
  const std::filesystem::path dead = "/dev/shm/dpactor-shm-" + std::to_string(child) + "-test",
                              live = "/dev/shm/dpactor-shm-" + std::to_string(::getpid()) + "-test";
  std::ofstream(dead) << "x";
  std::ofstream(live) << "x";
  sweep_stale_segments();
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(live));
  std::filesystem::remove(live);
}

}  // namespace
}  // namespace dpactor
