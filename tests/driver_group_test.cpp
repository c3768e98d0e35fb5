// The asynchronous collective (the `nccl` backend's logic) through a fake
// communicator: completion by polling, asynchronous errors, hangs that time
// out, aborts from another thread, drivers that throw. See Note [Never block
// on a GPU collective].

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "comms/collective.hpp"
#include "comms/driver_group.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

struct fake_world {
  std::atomic<int> polls_needed{3};
  std::atomic<int> polls{0};
  std::atomic<int> enqueued{0};
  std::atomic<bool> async_error{false};
  std::atomic<bool> hang{false};
  std::atomic<bool> throw_on_enqueue{false};
  std::atomic<bool> done_survives_abort{false};  // as the NCCL driver: work finished before an abort stands
  std::atomic<int> aborts{0};
};

class fake_driver final : public collective_driver {
 public:
  explicit fake_driver(fake_world& w) : world_(w) {}
  void all_reduce_sum(float*, std::size_t) override { enqueue(); }
  void all_reduce_sum_after(float*, std::size_t, void*) override { enqueue(); }
  void broadcast(float*, std::size_t, int) override { enqueue(); }
  void reduce_tree(std::span<const int>, std::span<float* const>, std::span<const tree_step>, float*, std::size_t) override {
    enqueue();
  }
  void all_gather_chunks(std::span<const std::span<float>>, std::span<const std::pair<std::size_t, std::size_t>>) override {
    enqueue();
  }
  state poll(std::string& error) override {
    ++world_.polls;
    if (aborted_ && world_.done_survives_abort && !world_.hang) return state::done;
    if (aborted_) {
      error = "aborted";
      return state::failed;
    }
    if (world_.async_error) {
      error = "injected asynchronous error";
      return state::failed;
    }
    if (world_.hang || ++polls_ < world_.polls_needed) return state::pending;
    return state::done;
  }
  void abort() noexcept override {
    if (!aborted_.exchange(true)) ++world_.aborts;
  }

 private:
  void enqueue() {
    if (world_.throw_on_enqueue) throw std::runtime_error("injected enqueue failure");
    ++world_.enqueued;
    polls_ = 0;
  }
  fake_world& world_;
  int polls_ = 0;
  std::atomic<bool> aborted_{false};
};

std::shared_ptr<collective_group> fake_group(int ranks, fake_world& world) {
  return make_driver_group(ranks, [&world](int, int, const std::atomic<bool>&) { return std::make_unique<fake_driver>(world); });
}

TEST(DriverGroup, CallsCompleteByPolling) {
  fake_world world;
  auto group = fake_group(2, world);
  auto endpoint = group->endpoint(0);
  std::vector<float> v(10, 1.0f);
  EXPECT_NO_THROW(endpoint->all_reduce_sum(v, {}));
  EXPECT_NO_THROW(endpoint->broadcast(v, 1, {}));
  EXPECT_NO_THROW(endpoint->barrier({}));
  const std::span<float> sections[] = {v};
  EXPECT_NO_THROW(endpoint->all_gather(sections, {}));
  EXPECT_EQ(endpoint->size(), 2);
  EXPECT_EQ(world.aborts, 0);
}

TEST(DriverGroup, ChunksMatchTheLocalBackend) {
  fake_world world;
  auto endpoint = fake_group(3, world)->endpoint(1);
  EXPECT_EQ(endpoint->chunk(100, 0), (std::pair<std::size_t, std::size_t>{0, 48}));
  EXPECT_EQ(endpoint->chunk(100, 1), (std::pair<std::size_t, std::size_t>{48, 96}));
  EXPECT_EQ(endpoint->chunk(100, 2), (std::pair<std::size_t, std::size_t>{96, 100}));
}

TEST(DriverGroup, AnAsynchronousErrorAbortsTheWholeGroup) {
  fake_world world;
  auto group = fake_group(2, world);
  auto a = group->endpoint(0), b = group->endpoint(1);
  world.async_error = true;
  std::vector<float> v(4);
  try {
    a->all_reduce_sum(v, {});
    FAIL() << "no error";
  } catch (const collective_error& e) {
    EXPECT_EQ(e.code(), collective_errc::aborted);
    EXPECT_NE(std::string(e.what()).find("injected asynchronous error"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(group->aborted());
  EXPECT_EQ(world.aborts, 2) << "every rank's communicator is aborted";
  world.async_error = false;
  EXPECT_THROW(b->all_reduce_sum(v, {}), collective_error) << "the other rank fails fast";
}

TEST(DriverGroup, AHungCallTimesOutAndAbortsTheGroup) {
  fake_world world;
  world.hang = true;
  auto group = fake_group(2, world);
  auto a = group->endpoint(0);
  std::vector<float> v(4);
  const auto start = std::chrono::steady_clock::now();
  try {
    a->all_reduce_sum(v, collective_options{50ms});
    FAIL() << "no timeout";
  } catch (const collective_error& e) {
    EXPECT_EQ(e.code(), collective_errc::timeout);
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  std::printf("[ measured ] a 50 ms call timed out after %.1f ms\n",
              std::chrono::duration<double, std::milli>(waited).count());
  EXPECT_GE(waited, 50ms);
  // Its own 50 ms, not the default timeout (ten minutes) nor a hang; the
  // bound is far from both, so a loaded machine does not trip it.
  EXPECT_LT(waited, default_collective_timeout / 60);
  EXPECT_TRUE(group->aborted());
}

// The abort, not the call's own 60 s timeout, ends the call: the error says
// aborted (a timeout would say timeout), and it comes long before 60 s.
TEST(DriverGroup, AbortFromAnotherThreadEndsAPendingCallLongBeforeItsTimeout) {
  fake_world world;
  world.hang = true;
  auto group = fake_group(2, world);
  std::atomic<bool> waiting{false};
  std::chrono::steady_clock::time_point aborted_at, woke_at;
  bool got_error = false;
  std::thread rank([&] {
    auto endpoint = group->endpoint(0);
    std::vector<float> v(4);
    waiting = true;
    try {
      endpoint->all_reduce_sum(v, collective_options{60s});
    } catch (const collective_error& e) {
      got_error = e.code() == collective_errc::aborted;
    }
    woke_at = std::chrono::steady_clock::now();
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(10ms);  // let it settle into polling (correctness does not depend on it)
  aborted_at = std::chrono::steady_clock::now();
  group->abort();
  rank.join();
  std::printf("[ measured ] the call ended %.2f ms after the abort\n",
              std::chrono::duration<double, std::milli>(woke_at - aborted_at).count());
  EXPECT_TRUE(got_error) << "the call must end with collective_errc::aborted";
  EXPECT_LT(woke_at - aborted_at, 20s) << "a third of the call's timeout";
}

TEST(DriverGroup, ADriverThatThrowsBreaksTheGroupWithACollectiveError) {
  fake_world world;
  world.throw_on_enqueue = true;
  auto group = fake_group(1, world);
  std::vector<float> v(4);
  try {
    group->endpoint(0)->all_reduce_sum(v, {});
    FAIL() << "no error";
  } catch (const collective_error& e) {
    EXPECT_NE(std::string(e.what()).find("injected enqueue failure"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(group->aborted());
}

TEST(DriverGroup, AStartedReduceScatterReturnsAtOnceAndTheNextCallWaitsForIt) {
  fake_world world;
  auto group = fake_group(2, world);
  auto endpoint = group->endpoint(0);
  ASSERT_TRUE(endpoint->overlaps_compute());
  std::vector<float> bucket(8), header(4);
  endpoint->start_reduce_scatter(bucket, nullptr);
  endpoint->start_reduce_scatter(bucket, nullptr);
  EXPECT_EQ(world.enqueued, 2);
  EXPECT_EQ(world.polls, 0) << "starting a bucket does not wait";
  endpoint->all_reduce_sum(header, {});
  EXPECT_GE(world.polls, world.polls_needed.load()) << "the header waited";
}

TEST(DriverGroup, AnErrorInAStartedBucketSurfacesAtTheNextCall) {
  fake_world world;
  auto group = fake_group(2, world);
  auto endpoint = group->endpoint(0);
  std::vector<float> bucket(8), header(4);
  endpoint->start_reduce_scatter(bucket, nullptr);
  world.async_error = true;  // the bucket's reduction fails on the GPU
  try {
    endpoint->all_reduce_sum(header, {});
    FAIL() << "no error";
  } catch (const collective_error& e) {
    EXPECT_NE(std::string(e.what()).find("injected asynchronous error"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(group->aborted());
  EXPECT_THROW(endpoint->start_reduce_scatter(bucket, nullptr), collective_error) << "nothing starts on a broken group";
}

TEST(DriverGroup, ADriverThatCannotStartABucketBreaksTheGroup) {
  fake_world world;
  auto group = fake_group(2, world);
  auto endpoint = group->endpoint(0);
  std::vector<float> bucket(8);
  world.throw_on_enqueue = true;
  EXPECT_THROW(endpoint->start_reduce_scatter(bucket, nullptr), collective_error);
  EXPECT_TRUE(group->aborted());
  EXPECT_EQ(world.aborts, 1);
}

struct counting_observer final : late_observer {
  void on_late(std::span<const int> missing) override {
    ++calls;
    last_size = missing.size();
  }
  int calls = 0;
  std::size_t last_size = 99;
};

TEST(DriverGroup, AWaitPastTheDeadlineTellsTheObserverOnceWithoutNames) {
  fake_world world;
  world.polls_needed = 1'000'000'000;  // pending until released below
  auto group = fake_group(2, world);
  auto endpoint = group->endpoint(0);
  counting_observer observer;
  collective_options options;
  options.observer = &observer;
  options.late_at = std::chrono::steady_clock::now();  // already late
  options.timeout = 60s;
  std::thread release([&] {
    while (world.polls < 1000) std::this_thread::yield();
    world.polls_needed = 0;
  });
  std::vector<float> header(4);
  endpoint->all_reduce_sum(header, options);
  release.join();
  EXPECT_EQ(observer.calls, 1) << "once per call";
  EXPECT_EQ(observer.last_size, 0u) << "a driver cannot tell who is missing";
  observer.calls = 0;
  options.late_at = std::chrono::steady_clock::now() + 60s;
  world.polls_needed = 3;
  endpoint->all_reduce_sum(header, options);
  EXPECT_EQ(observer.calls, 0) << "not late: not told";
}

TEST(DriverGroup, ARankThatCannotSetUpBreaksTheGroup) {
  fake_world world;
  auto group = make_driver_group(2, [&world](int rank, int, const std::atomic<bool>&) -> std::unique_ptr<collective_driver> {
    if (rank == 1) throw std::runtime_error("injected set-up failure");
    return std::make_unique<fake_driver>(world);
  });
  try {
    group->endpoint(1);
    FAIL() << "no error";
  } catch (const collective_error& e) {
    EXPECT_NE(std::string(e.what()).find("injected set-up failure"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(group->aborted()) << "the other ranks would wait for it";
}

// An abort that comes after this rank's work finished, but before the rank
// saw it finish, does not undo the call; unfinished work fails.
TEST(DriverGroup, WorkFinishedBeforeAnAbortStands) {
  for (const bool finished : {true, false}) {
    fake_world world;
    world.hang = true;
    world.polls_needed = 1'000'000'000;  // only the abort path can end the call well
    world.done_survives_abort = true;
    auto group = fake_group(2, world);
    std::atomic<bool> threw{false};
    std::thread rank([&] {
      auto endpoint = group->endpoint(0);
      std::vector<float> v(4);
      try {
        endpoint->all_reduce_sum(v, collective_options{60s});
      } catch (const collective_error&) {
        threw = true;
      }
    });
    while (world.polls < 10) std::this_thread::yield();
    if (finished) world.hang = false;  // the work completes ...
    group->abort();                    // ... and the group is aborted before the rank polls again
    rank.join();
    EXPECT_EQ(threw, !finished) << (finished ? "finished work stands" : "unfinished work fails");
  }
}

}  // namespace
}  // namespace dpactor
