// Same bytes whatever happens (train.reproducible, the default; See Note
// [Summation tree] and Note [Stealing slices]): 300 steps of the default job
// give byte-identical model.safetensors and optimizer.safetensors with 1 to 4
// replicas, a slow replica, a failed one, a hung one, a join, a leave, a
// resume from step 150, and a run stopped by SIGINT at a random step and
// resumed (slices of 16 run 150 steps, the CNN and the round modes, slower
// a step, 100: each event at the same fraction of the run, to keep CI
// under 30 minutes). The runs are the dpactor program's; the test compares the files
// itself. Each case runs with the default slice (train.micro_batch 64: two
// slices a step) and with slices of 16 (eight a step, so that stealing and
// uneven trees happen), and on the libtorch replica with the CNN of
// configs/cnn.cfg (slices of 16, four a step); and in the round modes
// (diloco with the int8 codec and the delay: 100 rounds of H = 2; streaming
// diloco with the bf16 codec and 2 fragments: 100 steps of one inner step; 4
// logical workers),
// whose checkpoints also hold the workers' inner states, residuals and own
// parameters (workers.safetensors, compared through the resumed runs' final
// bytes). Every test compares against the case's quiet run (2 replicas, no
// faults); ctest runs each test in its own process, so the first to run it
// keeps its bytes in the build tree for the others (quiet_cache, keyed by
// the program's and library's files, the command and the config).

#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>

#include "tests/test_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;

const std::string dataset = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// A checkpoint's directory name: step-00000150.
std::string step_directory(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return name;
}

// A case: the job's config (configs/mlp.cfg, or configs/cnn.cfg on the
// libtorch replica) and the slice.
struct job_case {
  std::string config;
  int micro_batch = 64;
  std::string mode = "every_step";  // sync.mode: the round modes run rounds of 4 logical workers, H = 2
  std::string codec = "fp32";       // sync.codec of the round modes
  int fragments = 1;                // sync.fragments (a step is then H / P inner steps)
  int delay = 0;                    // sync.delay
  int steps = 300;                  // the run's steps; the events fall at the same fractions of it
};

std::string job_case_name(const job_case& c) {
  if (c.mode != "every_step")
    return c.config + "_" + c.mode + "_" + c.codec + (c.fragments > 1 ? "_fragments" + std::to_string(c.fragments) : "") +
           (c.delay > 0 ? "_delay" : "");
  return c.config + "_micro_batch_" + std::to_string(c.micro_batch);
}
// What gtest prints of the parameter in a test's listed name (and so in
// ctest's): its name, not its bytes, which hold heap addresses and changed
// every build, so ctest's timing data never matched a test.
void PrintTo(const job_case& c, std::ostream* os) { *os << job_case_name(c); }

// The quiet run's bytes, kept in the build tree (build/test-cache) under a
// key of everything they follow: the program and library files (size and
// modification time), the command and the config file's text. A key that
// differs in any of them is another file; the file holds its whole key,
// compared before its bytes are used. Written under a private name and
// renamed, so a reader sees a whole file or none.
class quiet_cache {
 public:
  quiet_cache(const std::string& name, const std::string& config, const std::vector<std::string>& args) {
    const fs::path build = testing::cli_program().parent_path().parent_path();
    const auto stamp = [&](const fs::path& f) {
      std::error_code ec;
      const auto size = fs::file_size(f, ec);
      const auto time = fs::last_write_time(f, ec).time_since_epoch().count();
      key_ += f.string() + " " + std::to_string(size) + " " + std::to_string(time) + "\n";
    };
    stamp(testing::cli_program());
    for (const auto& entry : fs::directory_iterator(build))
      if (entry.path().filename().string().rfind("libdpactor", 0) == 0) stamp(entry.path());
    for (const auto& a : args) key_ += a + "\n";
    key_ += testing::read_text(std::string(DPACTOR_SOURCE_DIR) + "/configs/" + config + ".cfg");
    char hash[32];
    std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(key_));
    file_ = build / "test-cache" / "same-bytes" / (name + "-" + hash);
  }

  std::optional<std::string> read() const {
    if (!fs::exists(file_)) return std::nullopt;
    const std::string text = testing::read_text(file_);
    const auto end = text.find('\n');
    if (end == std::string::npos) return std::nullopt;
    const std::size_t key_size = std::stoul(text.substr(0, end));
    if (text.compare(end + 1, key_size, key_) != 0) return std::nullopt;
    return text.substr(end + 1 + key_size);
  }

  void write(const std::string& bytes) const {
    fs::create_directories(file_.parent_path());
    const fs::path partial = file_.string() + ".partial-" + std::to_string(::getpid());
    testing::write_text(partial, std::to_string(key_.size()) + "\n" + key_ + bytes);
    fs::rename(partial, file_);
  }

 private:
  std::string key_;
  fs::path file_;
};

class SameBytes : public ::testing::TestWithParam<job_case> {
 protected:
  void SetUp() override {
    if (!fs::exists(dataset)) GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup installs it)";
    DPACTOR_SKIP_WITHOUT(GetParam().config == "cnn" ? testing::replica_kind::torch : testing::replica_kind::mlp);
  }

  // The job for the case's steps, with its slice, plus `extra`.
  std::vector<std::string> args(const std::string& name, std::vector<std::string> extra) const {
    std::vector<std::string> a{"--model", std::string(DPACTOR_SOURCE_DIR) + "/configs/" + GetParam().config + ".cfg",
                               "--quiet", "--checkpoint-dir", name, "--set", "train.max_steps=" + std::to_string(steps()), "--set",
                               "train.micro_batch=" + std::to_string(GetParam().micro_batch), "--set",
                               "train.eval_every=0"};
    if (rounds())
      a.insert(a.end(), {"--set", "sync.mode=\"" + GetParam().mode + "\"", "--set", "sync.workers=4", "--set",
                         "sync.every=2", "--set", "sync.codec=\"" + GetParam().codec + "\"", "--set",
                         "sync.fragments=" + std::to_string(GetParam().fragments), "--set",
                         "sync.delay=" + std::to_string(GetParam().delay)});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  bool rounds() const { return GetParam().mode != "every_step"; }
  int steps() const { return GetParam().steps; }
  // The step at `fraction` of the run (a fault spec's step, a checkpoint's).
  std::string at(double fraction) const { return std::to_string(static_cast<int>(steps() * fraction)); }

  // Runs to the last step and returns the two files' bytes.
  std::string run(const std::string& name, std::vector<std::string> extra) {
    const auto r = testing::run_cli(args(name, std::move(extra)), dir_.path());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return final_bytes(name);
  }

  std::string final_bytes(const std::string& name) const {
    const fs::path step = dir_ / name / step_directory(steps());
    if (!fs::exists(step)) return "no checkpoint at step " + std::to_string(steps()) + " in " + name;
    return testing::read_text(step / "model.safetensors") + testing::read_text(step / "optimizer.safetensors");
  }

  // The quiet run every other one must equal (2 replicas, no faults). ctest
  // runs each test in its own process: the first to run a case's quiet run
  // keeps its bytes for the others (quiet_cache), which run their own
  // commands only.
  const std::string& quiet() {
    if (!quiet_.empty()) return quiet_;
    const auto a = args("quiet", {"--cpus", "2"});
    quiet_cache cache(job_case_name(GetParam()), GetParam().config, a);
    if (auto kept = cache.read()) return quiet_ = *kept;
    quiet_ = run("quiet", {"--cpus", "2"});
    if (fs::exists(dir_ / "quiet" / step_directory(steps()))) cache.write(quiet_);
    return quiet_;
  }

  testing::scratch_dir dir_;
  std::string quiet_;
};

// Byte comparison with a readable failure (the files are ~1 MB).
void expect_same_bytes(const std::string& got, const std::string& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  EXPECT_TRUE(diff.first == got.end()) << what << ": first differing byte at offset " << (diff.first - got.begin());
}

TEST_P(SameBytes, TwoRunsOfTheSameCommand) { expect_same_bytes(run("again", {"--cpus", "2"}), quiet(), "a second run"); }

TEST_P(SameBytes, OneThreeAndFourReplicas) {
  for (const char* n : {"1", "3", "4"})
    expect_same_bytes(run(std::string("cpus") + n, {"--cpus", n}), quiet(), std::string("--cpus ") + n);
}

TEST_P(SameBytes, AReplicaThreeTimesSlower) {
  expect_same_bytes(run("slow", {"--cpus", "2", "--inject", "slow:1:3"}), quiet(), "slow:1:3");
}

TEST_P(SameBytes, AFailedReplica) {
  const std::string spec = "fail:1@" + at(0.5);
  expect_same_bytes(run("fail", {"--cpus", "3", "--inject", spec}), quiet(), spec);
}

TEST_P(SameBytes, AHungReplica) {
  const std::string spec = "hang:1@" + at(0.5);
  expect_same_bytes(run("hang", {"--cpus", "3", "--inject", spec, "--set", "cluster.hang_timeout_s=0.5"}), quiet(), spec);
}

TEST_P(SameBytes, AReplicaThatJoins) {
  const std::string spec = "join:cpu@" + at(1.0 / 3);
  expect_same_bytes(run("join", {"--cpus", "2", "--inject", spec}), quiet(), spec);
}

TEST_P(SameBytes, AReplicaThatLeaves) {
  const std::string spec = "leave:1@" + at(1.0 / 3);
  expect_same_bytes(run("leave", {"--cpus", "3", "--inject", spec}), quiet(), spec);
}

TEST_P(SameBytes, AResumeFromItsOwnMidRunCheckpoint) {
  const std::string first = run("first", {"--cpus", "2", "--checkpoint-every", at(0.5)});
  expect_same_bytes(first, quiet(), "the run that wrote the checkpoint");
  const std::string middle = "first/" + step_directory(std::stoi(at(0.5)));
  ASSERT_TRUE(fs::exists(dir_ / middle));
  expect_same_bytes(run("resumed", {"--cpus", "3", "--resume", middle}), quiet(), "resumed from " + middle + " on 3 replicas");
}

TEST_P(SameBytes, ARunStoppedBySigintAtARandomStepAndResumed) {
  std::random_device seed;
  const int at = std::uniform_int_distribution<int>(5, steps() - 20)(seed);
  SCOPED_TRACE("SIGINT once step " + std::to_string(at) + " is reported");
  auto a = args("stopped", {"--cpus", "2", "--metrics", "m.jsonl", "--set", "train.log_every=1"});
  testing::cli_process child(a, dir_.path());
  const std::string mark = "\"event\":\"step\",\"step\":" + std::to_string(at) + ",";
  ASSERT_TRUE(testing::eventually(
      [&] { return !child.running() || testing::read_text(dir_ / "m.jsonl").find(mark) != std::string::npos; },
      std::chrono::seconds(120)))
      << "step " << at << " not reported within 120 s: " << child.output_so_far();
  ASSERT_TRUE(child.running()) << "the run ended before the signal: " << child.output_so_far();
  child.signal(SIGINT);
  const auto stopped = child.wait();
  ASSERT_EQ(stopped.exit_code, 130) << stopped.output;
  expect_same_bytes(run("after-sigint", {"--cpus", "1", "--resume", "stopped"}), quiet(),
                    "stopped by SIGINT, resumed on 1 replica");
}

// The CNN's steps are 64 samples: slices of 16 give four to share.
INSTANTIATE_TEST_SUITE_P(Slices, SameBytes,
                         ::testing::Values(job_case{"mlp", 64}, job_case{"mlp", 16, "every_step", "fp32", 1, 0, 150},
                                           job_case{"cnn", 16, "every_step", "fp32", 1, 0, 100},
                                           job_case{"mlp", 64, "diloco", "int8", 1, 1, 100},
                                           job_case{"mlp", 64, "diloco", "fp32", 1, 1, 100},
                                           job_case{"mlp", 64, "diloco", "bf16", 2, 0, 100}),
                         [](const auto& info) { return job_case_name(info.param); });

}  // namespace
}  // namespace dpactor
