// The Engine facade: repeated start/stop in one process (A9; CI also runs this
// suite under AddressSanitizer and LeakSanitizer), events, snapshots, and
// misuse.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include <dpactor/log.hpp>
#include "tensors/gemm.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

TEST(EngineLifecycle, StartsAndStops100TimesInOneProcess) {
  job_config c = testing::small_job(2, 32, 256);
  c.train.epochs = 2;
  Engine engine(c);
  int stopped = 0;
  for (int i = 0; i < 100; ++i) {
    engine.start();
    EXPECT_TRUE(engine.running());
    if (i % 2 == 1) engine.stop();  // every other run is stopped early
    const run_summary s = engine.wait();
    EXPECT_FALSE(engine.running());
    if (i % 2 == 0) {
      EXPECT_EQ(s.steps, 16) << "run " << i;
      EXPECT_FALSE(s.stopped);
    } else if (s.stopped) {
      EXPECT_LE(s.steps, 16) << "run " << i;
      ++stopped;
    } else {
      // A run of 16 small steps can end before the stop reaches it: then it
      // ended whole, and says so.
      EXPECT_EQ(s.steps, 16) << "run " << i << " was neither stopped nor whole";
    }
  }
  std::printf("%d of the 50 stopped runs ended early\n", stopped);
  EXPECT_GT(stopped, 0) << "no stop took effect";
}

// See Note [cuBLAS is loaded when a GPU replica first needs it]: a process
// that trains on CPUs never maps cuBLAS (half a second of start-up each).
TEST(EngineLifecycle, ARunOnCpusLoadsNoCublas) {
  Engine engine(testing::small_job(2, 32, 256));
  engine.start();
  EXPECT_EQ(engine.wait().steps, 8);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
}

// See Note [What an engine does to its process]: a run sets OpenBLAS's one
// thread count for its replicas (1 in reproducible mode) and gives the host's
// back when it ends; it logs through the host's handler when there is one.
TEST(EngineLifecycle, ARunGivesBackTheHostsBlasThreadsAndLogsThroughItsHandler) {
  set_blas_threads(2);
  std::mutex mutex;
  std::vector<std::string> lines;
  set_log_handler([&](log_level, std::string_view line) {
    std::lock_guard lock(mutex);
    lines.emplace_back(line);
  });
  testing::scratch_dir dir;
  job_config c = testing::small_job(2, 32, 256);
  c.train.checkpoint_dir = (dir / "checkpoints").string();
  Engine engine(c);
  std::atomic<int> during{0};
  engine.on_event([&](const event&) { during = blas_threads(); });
  engine.start();
  engine.wait();
  set_log_handler({});
  EXPECT_EQ(during, 1) << "a reproducible run's replicas use one OpenBLAS thread each";
  EXPECT_EQ(blas_threads(), 2) << "the host's count is back after the run";
  std::lock_guard lock(mutex);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) { return l.find("checkpoint written") != std::string::npos; }))
      << lines.size() << " lines reached the handler";
}

TEST(EngineLifecycle, ReportsEventsInOrder) {
  job_config c = testing::small_job(2, 32, 256);
  c.train.epochs = 2;
  c.train.log_every = 4;
  std::mutex m;
  std::vector<event> events;
  Engine engine(c);
  engine.on_event([&](const event& e) {
    std::lock_guard lock(m);
    events.push_back(e);
  });
  engine.start();
  const run_summary s = engine.wait();
  ASSERT_FALSE(events.empty());
  const auto* start = std::get_if<membership_event>(&events.front());
  ASSERT_NE(start, nullptr) << "the first event is the first generation";
  EXPECT_EQ(start->members, (std::vector<std::string>{"cpu:0", "cpu:1"}));
  int steps = 0, epochs = 0;
  std::int64_t last_step = 0;
  for (const auto& e : events) {
    if (const auto* st = std::get_if<step_event>(&e)) {
      ++steps;
      EXPECT_GT(st->step, last_step);
      EXPECT_EQ(st->step % 4, 0);
      EXPECT_GT(st->samples_per_s, 0.0);
      last_step = st->step;
    }
    if (const auto* ep = std::get_if<epoch_event>(&e)) {
      EXPECT_EQ(ep->epoch, epochs++);
      EXPECT_EQ(ep->samples, 256);
      EXPECT_GT(ep->test_accuracy, 0.0);
    }
  }
  EXPECT_EQ(steps, 4);  // 16 steps, every 4th
  EXPECT_EQ(epochs, 2);
  EXPECT_EQ(s.epochs, 2);
  EXPECT_EQ(s.samples, 512);
  EXPECT_GT(s.test_accuracy, 0.5) << "the synthetic blobs are learnable";
}

TEST(EngineLifecycle, SnapshotIsTakenAtAStepBoundaryWhileTraining) {
  job_config c = testing::small_job(2, 32, 4096);
  c.train.epochs = 50;
  std::atomic<std::int64_t> steps_seen{0};
  Engine engine(c);
  engine.on_event([&](const event& e) {
    if (const auto* st = std::get_if<step_event>(&e)) steps_seen = st->step;
  });
  engine.start();
  ASSERT_TRUE(testing::eventually([&] { return steps_seen >= 20; }, std::chrono::seconds(60)))
      << "the run is not under way";
  const parameter_snapshot a = engine.snapshot();
  ASSERT_TRUE(testing::eventually([&] { return steps_seen >= a.step + 40; }, std::chrono::seconds(60)))
      << "the run stopped at step " << steps_seen;
  const parameter_snapshot b = engine.snapshot();
  engine.stop();
  engine.wait();
  EXPECT_GE(a.step, 20);
  EXPECT_GT(b.step, a.step);
  ASSERT_EQ(a.tensor("0.weight").size(), 32u * 16u);
  EXPECT_EQ(a.tensor("2.bias").size(), 4u);
  EXPECT_NE(std::vector<float>(a.tensor("0.weight").begin(), a.tensor("0.weight").end()),
            std::vector<float>(b.tensor("0.weight").begin(), b.tensor("0.weight").end()));
  EXPECT_THROW(engine.snapshot(), std::runtime_error) << "no run in progress";
}

TEST(EngineLifecycle, SnapshotFromAThreadThatOutlivesTheRunDoesNotBlockShutdown) {
  // Regression: a CAF scoped_actor in a user thread kept the actor system
  // from shutting down until that thread exited.
  job_config c = testing::small_job(2, 32, 2048);
  Engine engine(c);
  engine.start();
  std::atomic<bool> taken{false}, done{false};
  std::thread server([&] {
    engine.snapshot();
    taken = true;
    while (!done) std::this_thread::yield();
  });
  // (a failed ASSERT here leaves `server` joinable: the program terminates, which fails the test too)
  ASSERT_TRUE(testing::eventually([&] { return taken.load(); }, std::chrono::seconds(60))) << "no snapshot";
  // Must return while `server` still runs.
  const run_summary s = testing::wait_or_exit(engine, std::chrono::seconds(60), "a run with a snapshot thread alive");
  done = true;
  server.join();
  EXPECT_EQ(s.steps, 64);
}

TEST(EngineLifecycle, ARunStartedInOneThreadEndsWhenWaitedForInAnother) {
  // Regression: CAF 0.17 kept the actor system's logger in the starting
  // thread's thread-local, so ~actor_system in any other thread never returned.
  job_config c = testing::small_job(2, 32, 512);
  for (int run = 0; run < 3; ++run) {
    Engine engine(c);
    engine.start();
    const run_summary s = testing::wait_or_exit(engine, std::chrono::seconds(60), "a run waited for in another thread");
    EXPECT_EQ(s.steps, 16);
    // The teardown gives up on a system it cannot destroy and leaves it
    // behind: that is the hang, bounded, and must not happen here.
    EXPECT_FALSE(engine.left_threads_behind()) << "run " << run << ": the actor system was not destroyed";
  }
  Engine engine(c);
  std::thread([&] { engine.start(); }).join();
  EXPECT_EQ(testing::wait_or_exit(engine, std::chrono::seconds(60), "a run started in another thread").steps, 16);
  EXPECT_FALSE(engine.left_threads_behind()) << "the actor system was not destroyed";
}

TEST(EngineLifecycle, StopBeforeStartEndsTheNextRunAtOnce) {
  job_config c = testing::small_job(1, 32, 256);
  c.train.epochs = 1000;
  c.train.steps_per_message = 1;  // so that at most `prefetch` steps are queued
  Engine engine(c);
  engine.stop();
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_TRUE(s.stopped);
  EXPECT_LE(s.steps, 2) << "at most the prefetched steps";
}

// The code of the dpactor::error that f() throws; internal (and a failure)
// when it throws none.
template <class F>
error_kind code_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error thrown";
  return error_kind::internal;
}

TEST(EngineLifecycle, SecondStartWhileRunningIsRefused) {
  job_config c = testing::small_job(1, 32, 256);
  c.train.epochs = 1000;
  Engine engine(c);
  engine.start();
  EXPECT_EQ(code_of([&] { engine.start(); }), error_kind::already_running);
  engine.stop();
  engine.wait();
  EXPECT_EQ(code_of([&] { engine.wait(); }), error_kind::no_run);
}

// Every public method that needs a run says so by its error's code, before a
// run, and after one has ended.
TEST(EngineErrors, CallsWithoutARunHaveTheCodeNoRun) {
  const testing::scratch_dir dir;
  job_config c = testing::small_job(1, 32, 256);
  c.train.checkpoint_dir = (dir / "checkpoints").string();
  run_options o;
  o.overwrite_checkpoints = true;  // the second run writes where the first did
  Engine engine(c, o);
  for (int before_and_after = 0; before_and_after < 2; ++before_and_after) {
    EXPECT_EQ(code_of([&] { engine.wait(); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { engine.add_device(std::chrono::seconds(1)); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { engine.remove_device("cpu:0"); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { (void)engine.members(); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { engine.request_checkpoint(); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { engine.set_lr(0.01); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { engine.inject("slow:0:2"); }), error_kind::no_run);
    EXPECT_EQ(code_of([&] { (void)engine.snapshot(); }), error_kind::no_run);
    engine.start();
    engine.wait();
  }
}

TEST(EngineErrors, ArgumentsAndTheJobsOwnLimitsHaveTheirCodes) {
  job_config c = testing::small_job(1, 32, 256);
  c.train.epochs = 1000;
  Engine engine(c);
  engine.start();
  EXPECT_EQ(code_of([&] { engine.set_lr(0.0); }), error_kind::invalid_argument);
  EXPECT_EQ(code_of([&] { engine.request_checkpoint(); }), error_kind::config) << "no train.checkpoint_dir";
  const std::vector<record> one{record{0, 0, std::vector<float>(16, 0.0f)}};
  EXPECT_EQ(code_of([&] { engine.feed(one); }), error_kind::config) << "not a stream job";
  EXPECT_EQ(code_of([&] { engine.inject("slow:0:1"); }), error_kind::config) << "a factor of 1 slows nothing";
  engine.stop();
  engine.wait();
}

TEST(EngineErrors, AnUnknownDeviceIsAnErrorNamingTheMembersAndMembersListsThem) {
  job_config c = testing::small_job(2, 32, 256);
  c.train.epochs = 1000;
  Engine engine(c);
  engine.start();
  EXPECT_EQ(engine.members(), (std::vector<std::string>{"cpu:0", "cpu:1"}));
  std::string message;
  try {
    engine.remove_device("cpu:7");
    ADD_FAILURE() << "removing cpu:7 was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_kind::unknown_device);
    message = e.what();
  }
  EXPECT_NE(message.find("\"cpu:7\""), std::string::npos) << message;
  EXPECT_NE(message.find("cpu:0, cpu:1"), std::string::npos) << message;
  EXPECT_EQ(engine.members(), (std::vector<std::string>{"cpu:0", "cpu:1"})) << "nothing changed";
  engine.remove_device("cpu:1");
  EXPECT_TRUE(testing::eventually([&] { return engine.members() == std::vector<std::string>{"cpu:0"}; },
                                  std::chrono::seconds(60)))
      << "cpu:1 left at a step boundary";
  engine.stop();
  engine.wait();
}

TEST(EngineErrors, ARequestTheRunDoesNotAnswerInTimeHasTheCodeTimeout) {
  job_config c = testing::small_job(1, 32, 256);
  c.train.epochs = 1000;
  Engine engine(c);
  engine.start();
  // A join waits for a step boundary: no run answers it within a microsecond.
  EXPECT_EQ(code_of([&] { engine.add_device(std::chrono::milliseconds(0)); }), error_kind::timeout);
  engine.stop();
  engine.wait();
}

TEST(EngineLifecycle, DestroyingARunningEngineStopsIt) {
  job_config c = testing::small_job(2, 32, 256);
  c.train.epochs = 100000;
  auto engine = std::make_unique<Engine>(c);
  engine->start();
  engine.reset();  // must return: stops at the next step boundary and tears down
  SUCCEED();
}

TEST(EngineLifecycle, BadConfigIsRefusedAtConstruction) {
  job_config c = testing::small_job(1, 32);
  c.optimizer.nesterov = true;
  c.optimizer.momentum = 0.0;
  EXPECT_THROW(Engine{c}, config_error);
}

}  // namespace
}  // namespace dpactor
