#pragma once
// Helpers shared by the test suites: scratch directories, small jobs, and
// running the dpactor program as a child process.

#include <cstdint>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <dpactor/engine.hpp>
#include "config/job_config.hpp"

namespace dpactor::testing {

// A fresh directory under the system temp dir, removed on destruction.
class scratch_dir {
 public:
  scratch_dir();
  ~scratch_dir();
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Run options that resume from a checkpoint, or start from given weights.
run_options resume_from(const std::filesystem::path& checkpoint);
run_options init_from(const std::filesystem::path& weights);

// A small synthetic classification job: 16 features, 4 classes, fast;
// straggler.policy = none, so its arithmetic does not depend on timing.
job_config small_job(std::int64_t replicas, std::int64_t batch, std::int64_t train_rows = 1024);

// The replica kinds a test of the engine runs on: the native MLP and its
// twin as a TorchScript module on the libtorch replica.
enum class replica_kind { mlp, torch };
std::string kind_name(replica_kind kind);
// gtest prints a parameter in the test's listed name: the kind's name.
void PrintTo(replica_kind kind, std::ostream* os);
// small_job on either kind: for torch, tests/data/torch/mlp_16_32_4.pt, the
// same 16-32-4 network (its own initial weights).
job_config small_job(replica_kind kind, std::int64_t replicas, std::int64_t batch, std::int64_t train_rows = 1024);
// Whether the libtorch plugin can be loaded here; if not, `why` says why (a
// test skips with it).
bool torch_available(std::string& why);
// Suites that run every test on both replica kinds derive their fixture from
// both_replicas, write TEST_P, and instantiate with
// DPACTOR_ON_BOTH_REPLICAS(suite). Inside, current_kind() is the running
// test's kind (for helpers that build jobs); a torch case skips, saying
// why, where the plugin is not built.
replica_kind current_kind();
class both_replicas : public ::testing::TestWithParam<replica_kind> {
 protected:
  void SetUp() override;
  void TearDown() override;
};
std::string kind_case_name(const ::testing::TestParamInfo<replica_kind>& info);
#define DPACTOR_ON_BOTH_REPLICAS(suite)                                                                        \
  INSTANTIATE_TEST_SUITE_P(BothReplicas, suite,                                                                \
                           ::testing::Values(::dpactor::testing::replica_kind::mlp,                           \
                                             ::dpactor::testing::replica_kind::torch),                         \
                           ::dpactor::testing::kind_case_name)

// Skips the current test when `kind` is torch and the plugin is missing.
#define DPACTOR_SKIP_WITHOUT(kind)                                                            \
  do {                                                                                       \
    std::string dpactor_why_;                                                                \
    if ((kind) == ::dpactor::testing::replica_kind::torch &&                                 \
        !::dpactor::testing::torch_available(dpactor_why_))                                  \
      GTEST_SKIP() << dpactor_why_;                                                          \
  } while (false)

// Every parameter of a checkpoint's model.safetensors, in file order.
std::vector<float> checkpoint_parameters(const std::filesystem::path& checkpoint);

// sqrt(sum (a - b)^2 / sum b^2), in double.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b);

// The bytes of an IDX file: magic 0x0000<type><ndims>, big-endian dims, values.
std::string idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& values);

void write_text(const std::filesystem::path& path, const std::string& text);
// The checkpoint directory that `root`/latest names.
std::filesystem::path latest_checkpoint(const std::filesystem::path& root);
std::string read_text(const std::filesystem::path& path);

struct process_result {
  int exit_code = -1;  // 128 + signal if killed by a signal
  std::string output;  // stdout and stderr together
};
// Environment changes for a child process: a value sets the variable, nullopt removes it.
using environment_changes = std::vector<std::pair<std::string, std::optional<std::string>>>;

// The dpactor program running as a child process, output to a file.
class cli_process {
 public:
  // `netns`: the name of a network namespace (ip netns) to run it in;
  // `program`: another program to run than dpactor (a test's helper).
  cli_process(const std::vector<std::string>& args, const std::filesystem::path& cwd,
              const environment_changes& env = {}, const std::string& netns = "", const std::string& program = "");
  ~cli_process();  // kills the child if it still runs
  void signal(int sig);
  // The exit; a child still running after `limit` is killed (exit code 137)
  // and the output says so, so that a hang fails the test instead of stalling it.
  process_result wait(std::chrono::seconds limit = default_process_limit);
  // Whether the child has not exited yet (it is reaped when it has).
  bool running();
  std::string output_so_far() const;

  static constexpr std::chrono::seconds default_process_limit{240};

 private:
  int pid_ = -1;
  std::optional<int> status_;  // waitpid's, once reaped
  std::filesystem::path log_;
};

// The message of the `Error` that f() throws, or "(no error)" when it throws
// none: a test then checks that the message names the file, key or value.
// Another exception is not caught, and fails the test.
inline const std::string no_error = "(no error)";
template <class Error, class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return no_error;
}

// Polls `condition` every millisecond until it holds (true) or `limit` passes (false).
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit);

// The port `p` prints after `announcement` and a colon ("serving HTTP on
// 127.0.0.1" reads PORT from "serving HTTP on 127.0.0.1:PORT"), once it has
// printed it; "" if it has not within `limit`.
std::string announced_port(const cli_process& p, const std::string& announcement, std::chrono::milliseconds limit);
// The port of a coordinator's first line, "listening on HOST:PORT".
std::string listening_port(const cli_process& p, const std::string& host, std::chrono::milliseconds limit);

// Engine::wait() with a deadline. A run that neither ends nor fails by then
// hangs, and a hung engine cannot be destroyed: the program prints what hung
// and exits with 1, so the test fails at once rather than at ctest's timeout.
run_summary wait_or_exit(Engine& engine, std::chrono::seconds limit, const std::string& what);

// The independent evidence of exactly-once: what the devices say they trained
// (trained_event, train.record_trained), not what the ledger counted. Feed it
// every event; check() compares each epoch with the training set.
class trained_evidence {
 public:
  void record(const event& e);
  // Every "trained" record of a metrics file (--metrics): a coordinator's
  // holds every device's, a worker's sent through the network.
  void record_metrics(const std::filesystem::path& metrics);
  // Epochs [0, epochs) each trained every index of [0, rows) exactly once:
  // the samples add up to `rows` and the digests to the digest of every index.
  // A record counts unless a later generation starts at or before its step
  // (the step was rolled back: trained_event::generation). Returns "" or
  // what is wrong, per epoch.
  std::string check(std::int64_t rows, std::int64_t epochs) const;
  // Every step's members carried the same state into it, by their own
  // checksums. Returns "" or the first step where two differ, naming both.
  std::string replicas_agree() const;
  // The first step `device` trained, if any.
  std::optional<std::int64_t> first_step_of(const std::string& device) const;
  // The devices that trained `step`.
  std::vector<std::string> members_of(std::int64_t step) const;

 private:
  mutable std::mutex mutex_;
  std::vector<trained_event> records_;
  std::map<std::int64_t, std::int64_t> generation_starts_;  // generation -> its first step (0-based)
  std::map<std::int64_t, std::map<std::string, std::uint64_t>> carried_;  // step -> device -> checksum
};

// Runs the dpactor program with `args`, in `cwd`, and waits for it.
process_result run_cli(const std::vector<std::string>& args, const std::filesystem::path& cwd);

// The dpactor program the tests run (the build's bin/dpactor).
std::filesystem::path cli_program();

// Bytes of every tensor in a safetensors file, by name (the data section only).
std::vector<std::pair<std::string, std::string>> tensor_bytes(const std::filesystem::path& file);

}  // namespace dpactor::testing
