// Acceptance of exactly-once offsets with a real crash: a service process
// (tests/stream_feeder.cpp) streams records at a steady rate and is killed
// with SIGKILL part-way; restarted, it resumes from its checkpoints and
// replays from the committed offset (and some records before it). The
// union of what the first run trained inside the checkpoint the second
// resumed from, and of what the second trained, is every record exactly
// once, by the devices' own reports. And the final bytes equal those of a
// run that was never killed.

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <sstream>

#include "stream_records.hpp"
#include "tensors/json.hpp"
#include "test_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::cli_process;
using testing::scratch_dir;

constexpr std::int64_t total = 6000;

std::vector<std::string> feeder_args(const scratch_dir& dir, const std::string& run, bool resume) {
  std::vector<std::string> args{"--checkpoints", (dir / (run + "-ckpt")).string(), "--log", (dir / (run + ".log")).string(),
                                "--records", std::to_string(total), "--rate", "3000"};
  if (resume) args.insert(args.end(), {"--resume", "--replay", "100"});
  return args;
}

std::vector<json> log_lines(const std::filesystem::path& file) {
  std::vector<json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception&) {
      // a line the kill cut short
    }
  }
  return out;
}

std::size_t count_of(const std::vector<json>& lines, const char* key) {
  return static_cast<std::size_t>(std::count_if(lines.begin(), lines.end(), [&](const json& j) { return j.contains(key); }));
}

TEST(StreamCrash, KilledAndRestartedTheCommittedCheckpointsHoldEveryRecordOnce) {
  scratch_dir dir;
  {
    cli_process first(feeder_args(dir, "run", false), dir.path(), {}, "", STREAM_FEEDER);
    ASSERT_TRUE(testing::eventually([&] { return count_of(log_lines(dir / "run.log"), "checkpoint") >= 3; }, 60s))
        << first.output_so_far();
    first.signal(SIGKILL);
    first.wait();
  }
  const auto first_log = log_lines(dir / "run.log");
  ASSERT_EQ(count_of(first_log, "end"), 0u) << "the first run finished before the kill: the test proves nothing";
  // The checkpoint the restart resumes from, read from disk.
  const auto ckpt = dir / "run-ckpt";
  const json trainer = json::parse(testing::read_text(testing::latest_checkpoint(ckpt) / "trainer.json"));
  const std::int64_t resumed_step = trainer.at("step").get<std::int64_t>();
  const std::int64_t committed = trainer.at("stream").at("committed_sequence").get<std::int64_t>();
  ASSERT_GT(committed, 0);
  ASSERT_LT(committed, total - 1);
  {
    cli_process second(feeder_args(dir, "run", true), dir.path(), {}, "", STREAM_FEEDER);
    const auto r = second.wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto lines = log_lines(dir / "run.log");
  // Everything after the first run's lines is the second run's.
  std::int64_t samples = 0;
  std::uint64_t digest = 0;
  bool second = false;
  std::int64_t reported_start = -2, final_committed = -2;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const json& j = lines[i];
    if (i >= first_log.size() && j.contains("start")) {
      second = true;
      reported_start = j.at("committed").get<std::int64_t>();
    }
    if (j.contains("end")) final_committed = j.at("committed").get<std::int64_t>();
    if (!j.contains("trained")) continue;
    // The first run's steps inside the checkpoint (trained events count
    // steps from 0; the checkpoint's step is the number of steps done).
    if (second || j.at("trained").get<std::int64_t>() < resumed_step) {
      samples += j.at("samples").get<std::int64_t>();
      digest += j.at("digest").get<std::uint64_t>();
    }
  }
  ASSERT_TRUE(second);
  EXPECT_EQ(reported_start, committed) << "the restart must report the checkpoint's offset";
  EXPECT_EQ(final_committed, total - 1);
  EXPECT_EQ(samples, total);
  EXPECT_EQ(digest, testing::stream_digest(total)) << "a record was lost or trained twice across the crash";

  // A run never killed ends with the same bytes.
  {
    cli_process quiet(feeder_args(dir, "quiet", false), dir.path(), {}, "", STREAM_FEEDER);
    const auto r = quiet.wait(120s);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto model = [&](const std::string& run) {
    const auto d = dir / (run + "-ckpt");
    return testing::latest_checkpoint(d) / "model.safetensors";
  };
  EXPECT_EQ(testing::tensor_bytes(model("run")), testing::tensor_bytes(model("quiet")));
}

}  // namespace
}  // namespace dpactor
