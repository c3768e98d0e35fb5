// An exception in any actor ends the run, never hangs it: a test-only throw
// in the loader, the reducer and a device each makes Engine::wait() return
// an error that names the actor, within seconds, and the program exit with a
// non-zero code.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>

#include <dpactor/engine.hpp>
#include "comms/collective.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;

// The throws run on both replica kinds (tests/test_support.hpp).
class ActorFailure : public testing::both_replicas {};

// Runs a small job with `fault`; returns the error's message and how long the run took.
std::pair<std::string, double> failing_run(int replicas, const std::string& fault, error_kind expected) {
  job_config c = testing::small_job(testing::current_kind(), replicas, 32, 1024);
  c.train.epochs = 100;
  c.faults.inject = {fault};
  const auto start = clock_type::now();
  std::string what;
  try {
    Engine engine(c);
    engine.start();
    testing::wait_or_exit(engine, std::chrono::seconds(60), fault);
    ADD_FAILURE() << fault << ": the run completed";
  } catch (const error& e) {
    EXPECT_EQ(e.kind(), expected) << e.what();
    what = e.what();
  }
  return {what, std::chrono::duration<double>(clock_type::now() - start).count()};
}

TEST_P(ActorFailure, AThrowInTheLoaderEndsTheRunNamingIt) {
  const auto [what, seconds] = failing_run(2, "crash:loader@5", error_kind::internal);
  EXPECT_NE(what.find("the loader failed"), std::string::npos) << what;
  EXPECT_NE(what.find("crash:loader@5"), std::string::npos) << what;
  EXPECT_LT(seconds, 10.0);
}

TEST_P(ActorFailure, AThrowInTheReducerEndsTheRunNamingIt) {
  const auto [what, seconds] = failing_run(2, "crash:reducer@5", error_kind::internal);
  EXPECT_NE(what.find("the reducer failed"), std::string::npos) << what;
  EXPECT_NE(what.find("crash:reducer@5"), std::string::npos) << what;
  EXPECT_LT(seconds, 10.0);
}

TEST_P(ActorFailure, AThrowInTheOnlyDeviceEndsTheRunNamingIt) {
  // With others left the run would go on without it (a fault, not an end).
  const auto [what, seconds] = failing_run(1, "fail:0@5", error_kind::training);
  EXPECT_NE(what.find("cpu:0 failed: injected failure"), std::string::npos) << what;
  EXPECT_LT(seconds, 10.0);
}

DPACTOR_ON_BOTH_REPLICAS(ActorFailure);

TEST(ActorFailureCli, TheProgramExitsWithTheInternalErrorCode) {
  testing::scratch_dir dir;
  testing::write_text(dir / "job.cfg",
                      "[data]\nformat = \"synthetic\"\nsynthetic_train = 512\nsynthetic_test = 64\n"
                      "[model]\nlayers = [32, 8, 4]\n[train]\nepochs = 50\nbatch_size = 32\ncheckpoint_dir = \"\"\n");
  const auto r = testing::run_cli({"--model", "job.cfg", "--cpus", "2", "--inject", "crash:loader@3"}, dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the loader failed"), std::string::npos) << r.output;
}

// A group that can never form: every call fails as a rendezvous past
// cluster.rendezvous_timeout_s does.
class unformable_group final : public collective_group {
  struct endpoint_that_fails final : collective {
    explicit endpoint_that_fails(int rank, int size) : rank_(rank), size_(size) {}
    [[noreturn]] static void fail() {
      throw collective_error(collective_errc::timeout, "rendezvous timed out waiting for g0/shm/1 in the store (test)");
    }
    int rank() const noexcept override { return rank_; }
    int size() const noexcept override { return size_; }
    void all_reduce_sum(std::span<float>, const collective_options&) override { fail(); }
    std::pair<std::size_t, std::size_t> chunk(std::size_t size, int) const noexcept override { return {0, size}; }
    void reduce_scatter_sum(std::span<float>, const collective_options&) override { fail(); }
    void all_gather(std::span<const std::span<float>>, const collective_options&) override { fail(); }
    void broadcast(std::span<float>, int, const collective_options&) override { fail(); }
    void reduce_scatter_tree(std::size_t, std::span<const tree_part>, std::span<float>, const collective_options&) override {
      fail();
    }
    void barrier(const collective_options&) override { fail(); }
    int rank_, size_;
  };

 public:
  explicit unformable_group(int size) : size_(size) {}
  int size() const noexcept override { return size_; }
  std::unique_ptr<collective> endpoint(int rank) override { return std::make_unique<endpoint_that_fails>(rank, size_); }
  void abort() override { aborted_ = true; }
  bool aborted() const noexcept override { return aborted_; }

 private:
  int size_;
  std::atomic<bool> aborted_{false};
};

TEST(CollectiveFailure, AGroupThatFailsInEveryGenerationEndsTheRunInsteadOfLooping) {
  // Before: 65 processes on 2 cores could not form their group within the
  // rendezvous timeout, and the reducer formed one failing generation after
  // another, for ever (docs/scale.md).
  job_config c = testing::small_job(2, 32, 1024);
  c.train.epochs = 100;
  run_options o;
  o.collective_backend = [](int members) { return std::make_shared<unformable_group>(members); };
  try {
    Engine engine(c, o);
    engine.start();
    testing::wait_or_exit(engine, std::chrono::seconds(60), "a group that never forms");
    ADD_FAILURE() << "the run completed";
  } catch (const error& e) {
    EXPECT_EQ(e.kind(), error_kind::training) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("the collective failed in 6 generations in a row at step 1 with no member lost"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("rendezvous timed out"), std::string::npos) << what;
    EXPECT_NE(what.find("cluster.rendezvous_timeout_s"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace dpactor
