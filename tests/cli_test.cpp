// The dpactor program as a user meets it: bad input of every kind gets a clear
// message and its documented exit code, leaves no checkpoint behind; SIGINT
// mid-epoch writes a checkpoint from which a resumed run completes.

#include <gtest/gtest.h>

#include <regex>

#include <zlib.h>

#include <csignal>
#include <thread>

#include "tensors/safetensors.hpp"
#include "tensors/json.hpp"
#include "tests/cli_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;
using testing::Cli;


TEST_F(Cli, TrainsTheSmallJobAndWritesMetrics) {
  const auto r = testing::run_cli({"--gpus", "all", "--model", "job.cfg", "--cpus", "2", "--metrics", "m.jsonl"}, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  const std::string warning = "no usable GPU";
  const auto first = r.output.find(warning);
  EXPECT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warning, first + 1), std::string::npos) << "one warning line";
  const std::string metrics = testing::read_text(dir / "m.jsonl");
  EXPECT_NE(metrics.find(R"("event":"membership")"), std::string::npos);
  EXPECT_NE(metrics.find(R"("event":"epoch")"), std::string::npos);
  const std::string last = metrics.substr(metrics.rfind("{\"event\""));
  for (const char* key : {"\"event\":\"summary\"", "\"test_accuracy\"", "\"test_loss\"", "\"samples_per_s\"", "\"wall_s\"",
                          "\"steps\":10", "\"epochs\":2"})
    EXPECT_NE(last.find(key), std::string::npos) << key << " missing from the summary record: " << last;
  EXPECT_EQ(testing::read_text(dir / "checkpoints" / "latest"), "step-00000010\n") << "a checkpoint at the end";
}

// sync.mode = "async": --replay-rounds follows the round decisions of an
// earlier run's --metrics file to its bytes (the same test loss, to the last
// printed digit of the summary record), and may not be the metrics file of
// the replay itself (an input).
TEST_F(Cli, AnAsyncRunIsReplayedFromItsMetricsFile) {
  const std::vector<std::string> job{"--model", "job.cfg", "--set", "sync.mode=\"async\"", "--set",
                                     "sync.every=2", "--set", "train.checkpoint_dir=\"\"", "--set", "sync.workers=2"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = job;
    args.insert(args.end(), more.begin(), more.end());
    return testing::run_cli(args, dir.path());
  };
  const auto first = with({"--cpus", "2", "--inject", "slow:1:3", "--metrics", "first.jsonl"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto replay = with({"--cpus", "1", "--replay-rounds", "first.jsonl", "--metrics", "replay.jsonl"});
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  const auto test_loss = [&](const char* file) {
    const std::string text = testing::read_text(dir / file);
    const json summary = json::parse(text.substr(text.rfind("{\"event\":\"summary\"")));
    return summary.at("test_loss").get<double>();
  };
  EXPECT_EQ(test_loss("replay.jsonl"), test_loss("first.jsonl"));
  const auto itself = with({"--cpus", "2", "--replay-rounds", "first.jsonl", "--metrics", "first.jsonl"});
  EXPECT_EQ(itself.exit_code, 2) << itself.output;
  EXPECT_NE(itself.output.find("--replay-rounds"), std::string::npos) << itself.output;
  EXPECT_EQ(testing::read_text(dir / "first.jsonl").find("\"event\":\"summary\"") != std::string::npos, true)
      << "the record is untouched";
  const auto other = with({"--cpus", "2", "--set", "optimizer.lr=0.2", "--replay-rounds", "first.jsonl"});
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("optimizer.lr = 0.2 (this run) against"), std::string::npos) << other.output;
}

TEST_F(Cli, HelpAndVersionExitZero) {
  EXPECT_EQ(testing::run_cli({"--help"}, dir.path()).exit_code, 0);
  const auto v = testing::run_cli({"--version"}, dir.path());
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.output.find("dpactor 0."), std::string::npos);
}

TEST_F(Cli, UsageErrorsExitTwo) {
  expect_failure({"--model"}, 2, "--model");
  expect_failure({"--model", "job.cfg", "--frobnicate"}, 2, "frobnicate");
  expect_failure({"--model", "job.cfg", "--gpus", "many"}, 2, "--gpus many");
  expect_failure({"--model", "missing.cfg"}, 2, "missing.cfg: config file not found");
}

TEST_F(Cli, MalformedToml) {
  write_config("epochs = = 3\n");
  expect_failure({"--model", "job.cfg"}, 2, "job.cfg:13:10: malformed TOML");
}

TEST_F(Cli, UnknownKey) {
  write_config("learning_rate = 0.1\n");
  expect_failure({"--model", "job.cfg"}, 2, "job.cfg:13:17: train.learning_rate: unknown key");
}

TEST_F(Cli, WrongType) {
  write_config("seed = \"forty-two\"\n");
  expect_failure({"--model", "job.cfg"}, 2, "job.cfg:13:8: train.seed: expected an integer, found a string");
}

TEST_F(Cli, NegativeLearningRate) {
  expect_failure({"--model", "job.cfg", "--set", "optimizer.lr=-0.5"}, 2,
                 "optimizer.lr: value -0.5 is out of range: must be > 0.0");
}

TEST_F(Cli, MissingDataFile) {
  write_config("", "train_images = \"nowhere.idx\"\n");
  expect_failure({"--model", "job.cfg"}, 3, "nowhere.idx: no such file");
}

TEST_F(Cli, IdxWithWrongMagic) {
  testing::write_text(dir / "images.idx", std::string("\x00\x00\x07\x02", 4) + std::string(64, '\x01'));
  expect_failure({"--model", "job.cfg"}, 3, "images.idx: bad magic number 0x00000702");
}

TEST_F(Cli, TruncatedIdxGz) {
  std::vector<std::uint8_t> pixels(4000 * 8);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 31 + i / 7);
  const std::string raw = testing::idx_bytes(0x08, {4000, 8}, pixels);
  gzFile f = gzopen((dir / "big.idx.gz").c_str(), "wb");
  gzwrite(f, raw.data(), static_cast<unsigned>(raw.size()));
  gzclose(f);
  const std::string gz = testing::read_text(dir / "big.idx.gz");
  testing::write_text(dir / "big.idx.gz", gz.substr(0, gz.size() * 2 / 3));
  write_config("", "train_images = \"big.idx.gz\"\n");
  expect_failure({"--model", "job.cfg"}, 3, "big.idx.gz: truncated");
}

TEST_F(Cli, CsvWithARaggedRow) {
  testing::write_text(dir / "train.csv", "0,1,2,3,4,5,6,7,8\n1,1,2,3,4,5,6,7\n");
  write_config("", "format = \"csv\"\ntrain_file = \"train.csv\"\ntest_file = \"train.csv\"\n");
  expect_failure({"--model", "job.cfg"}, 3, "train.csv:2: ragged row: 8 fields, expected 9");
}

TEST_F(Cli, LabelBeyondTheClasses) {
  std::vector<std::uint8_t> labels(40, 1);
  labels[17] = 3;  // the model has 3 classes: 0..2
  testing::write_text(dir / "labels.idx", testing::idx_bytes(0x08, {40}, labels));
  expect_failure({"--model", "job.cfg"}, 3, "labels.idx: label 3 of sample 17 is out of range: the model has 3 classes");
}

TEST_F(Cli, ModelInputDifferentFromTheData) {
  expect_failure({"--model", "job.cfg", "--set", "model.layers=[9, 6, 3]"}, 3,
                 "samples have 8 features but the model's input layer (model.layers[0]) has 9");
}

TEST_F(Cli, ResumeOfAMissingCheckpoint) {
  expect_failure({"--model", "job.cfg", "--resume", "no-such-dir"}, 4, "no-such-dir: no such checkpoint");
}

// Trains once into `ckpt`, then returns the checkpoint directory written.
fs::path train_once(const fs::path& dir) {
  const auto r = testing::run_cli({"--model", "job.cfg", "--checkpoint-dir", "ckpt"}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / "ckpt" / "step-00000010";
}

TEST_F(Cli, ResumeOfATruncatedCheckpoint) {
  const fs::path ckpt = train_once(dir.path());
  const std::string bytes = testing::read_text(ckpt / "model.safetensors");
  testing::write_text(ckpt / "model.safetensors", bytes.substr(0, bytes.size() - 7));
  expect_failure({"--model", "job.cfg", "--resume", "ckpt"}, 4, "model.safetensors: not a valid safetensors file");
  EXPECT_EQ(testing::read_text(dir / "ckpt" / "latest"), "step-00000010\n") << "the bad checkpoint is left as it was";
}

TEST_F(Cli, ResumeOfACheckpointWithABadHeader) {
  const fs::path ckpt = train_once(dir.path());
  std::string bytes = testing::read_text(ckpt / "optimizer.safetensors");
  bytes[8] = 'x';  // the header no longer starts with a brace
  testing::write_text(ckpt / "optimizer.safetensors", bytes);
  expect_failure({"--model", "job.cfg", "--resume", ckpt.string()}, 4, "optimizer.safetensors: not a valid safetensors file");
}

TEST_F(Cli, InitFromWeightsOfTheWrongShape) {
  const std::vector<float> w(6 * 9, 0.5f);
  save_safetensors(dir / "w.safetensors", {{"0.weight", {6, 9}, w}}, {});
  expect_failure({"--model", "job.cfg", "--init-from", "w.safetensors"}, 4,
                 "w.safetensors: tensor \"0.weight\" has shape [6, 9], the model needs [6, 8]");
}

TEST_F(Cli, SigintMidEpochCheckpointsAndTheResumedRunCompletes) {
  // Long enough that the signal lands mid-epoch: 200 epochs of 5 steps.
  testing::cli_process child(
      {"--model", "job.cfg", "--cpus", "2", "--epochs", "200", "--set", "train.log_every=1", "--metrics", "m.jsonl"},
      dir.path());
  // Wait until training is under way (step 7's record exists), then interrupt.
  ASSERT_NO_FATAL_FAILURE(wait_until_training(child, R"("event":"step","step":7)"));
  child.signal(SIGINT);
  const auto stopped = child.wait();
  EXPECT_EQ(stopped.exit_code, 130) << stopped.output;
  EXPECT_NE(stopped.output.find("SIGINT"), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("resume with --resume checkpoints/step-"), std::string::npos) << stopped.output;
  ASSERT_TRUE(fs::exists(dir / "checkpoints" / "latest"));
  const std::string latest = testing::read_text(dir / "checkpoints" / "latest");
  const auto resumed = testing::run_cli({"--model", "job.cfg", "--cpus", "2", "--epochs", "200", "--resume", "checkpoints"}, dir.path());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(1000 steps, 200 epochs)"), std::string::npos) << resumed.output;
  EXPECT_NE(testing::read_text(dir / "checkpoints" / "latest"), latest);
}

TEST_F(Cli, ASecondRunOnTheSameCheckpointDirectoryStopsAtOnceAndTheFirstIsUntouched) {
  testing::cli_process first({"--model", "job.cfg", "--epochs", "100000", "--set", "train.log_every=1", "--metrics",
                              "m.jsonl", "--checkpoint-dir", "shared", "--checkpoint-every", "5"},
                             dir.path());
  ASSERT_NO_FATAL_FAILURE(wait_until_training(first));
  fs::create_directories(dir / "second");  // its own working directory, for its own output file
  const auto second = testing::run_cli(
      {"--model", (dir / "job.cfg").string(), "--checkpoint-dir", (dir / "shared").string()}, dir / "second");
  EXPECT_EQ(second.exit_code, 4) << second.output;
  EXPECT_NE(second.output.find("shared is in use by another run (pid "), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("epoch"), std::string::npos) << "the second run trained: " << second.output;
  first.signal(SIGINT);
  const auto stopped = first.wait();
  EXPECT_EQ(stopped.exit_code, 130) << stopped.output;
  const auto resumed = testing::run_cli({"--model", "job.cfg", "--epochs", "1", "--resume", "shared"}, dir.path());
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
}

TEST_F(Cli, SighupWritesACheckpointAndExits129AndSigpipeIsIgnored) {
  testing::cli_process child({"--model", "job.cfg", "--epochs", "100000", "--set", "train.log_every=1", "--metrics", "m.jsonl"},
                             dir.path());
  ASSERT_NO_FATAL_FAILURE(wait_until_training(child));
  child.signal(SIGPIPE);  // ignored: the run goes on
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(child.running()) << "SIGPIPE ended the run: " << child.output_so_far();
  child.signal(SIGHUP);
  const auto r = child.wait();
  EXPECT_EQ(r.exit_code, 129) << r.output;
  EXPECT_NE(r.output.find("received SIGHUP"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "latest"));
}

TEST_F(Cli, SigtermExits143) {
  testing::cli_process child({"--model", "job.cfg", "--epochs", "100000", "--set", "train.log_every=1", "--metrics", "m.jsonl"},
                             dir.path());
  ASSERT_NO_FATAL_FAILURE(wait_until_training(child));
  child.signal(SIGTERM);
  const auto r = child.wait();
  EXPECT_EQ(r.exit_code, 143) << r.output;
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "latest"));
}

TEST_F(Cli, MetricsNamingTheConfigFileIsRefusedBeforeTrainingAndTheConfigIsUntouched) {
  const std::string config = testing::read_text(dir / "job.cfg");
  expect_failure({"--model", "job.cfg", "--metrics", "job.cfg"}, 2,
                 "--metrics job.cfg: is the config file (--model job.cfg)");
  fs::create_symlink(dir / "job.cfg", dir / "link.cfg");  // the same file by another name
  expect_failure({"--model", "job.cfg", "--metrics", "link.cfg"}, 2, "--metrics link.cfg: is the config file");
  EXPECT_EQ(testing::read_text(dir / "job.cfg"), config);
}

TEST_F(Cli, MetricsNamingADataFileIsRefusedBeforeTrainingAndTheDataIsUntouched) {
  const std::string labels = testing::read_text(dir / "labels.idx");
  // The config names it by its absolute path; the option by a relative one.
  expect_failure({"--model", "job.cfg", "--metrics", "./labels.idx"}, 2,
                 "--metrics ./labels.idx: is a data file (data.train_labels = " + (dir / "labels.idx").string() + ")");
  EXPECT_EQ(testing::read_text(dir / "labels.idx"), labels);
}

TEST_F(Cli, MetricsInsideTheCheckpointDirectoryIsRefused) {
  expect_failure({"--model", "job.cfg", "--checkpoint-dir", "ckpt", "--metrics", "ckpt/latest"}, 2,
                 "--metrics ckpt/latest: is a path the checkpoints in the checkpoint directory (train.checkpoint_dir = "
                 "ckpt) own");
  expect_failure({"--model", "job.cfg", "--checkpoint-dir", "ckpt", "--metrics", "ckpt/step-00000005/m.jsonl"}, 2,
                 "the checkpoint directory (train.checkpoint_dir = ckpt) own");
  EXPECT_FALSE(fs::exists(dir / "ckpt"));
  // Any other file in the directory is the user's: checkpoint_dir = "." and
  // metrics in the same folder is a normal layout.
  const testing::process_result r =
      testing::run_cli({"--model", "job.cfg", "--checkpoint-dir", ".", "--metrics", "m.jsonl"}, dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "m.jsonl"));
}

TEST_F(Cli, AMetricsWriteErrorStopsTheRunWithACheckpointAndExitsOne) {
  // Every write to /dev/full fails with ENOSPC, as on a full disk.
  testing::cli_process child({"--model", "job.cfg", "--epochs", "100000", "--set", "train.log_every=1", "--metrics", "/dev/full"},
                             dir.path());
  const auto r = child.wait(std::chrono::seconds(120));  // a run that ignored the error would train on
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--metrics /dev/full: cannot write: No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resume with --resume checkpoints/step-"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(dir / "checkpoints" / "latest")) << r.output;
  // The checkpoint resumes: a run to the end of its epoch (5 steps an epoch) completes.
  const std::string latest = testing::read_text(dir / "checkpoints" / "latest");
  const long long step = std::stoll(latest.substr(latest.find('-') + 1));
  const auto resumed = testing::run_cli(
      {"--model", "job.cfg", "--epochs", std::to_string(step / 5 + 1), "--resume", "checkpoints"}, dir.path());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
}

TEST_F(Cli, AHugeLearningRateOnTheDefaultJobExitsFiveNamingTheStepAndLeavesAResumableCheckpoint) {
  // Before: optimizer.lr = 1e6 exited 0 and wrote a checkpoint full of NaN.
  const std::string config = std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg";
  const testing::process_result r = testing::run_cli(
      {"--model", config, "--cpus", "2", "--set", "optimizer.lr=1e6", "--set", "train.checkpoint_every=1"}, dir.path());
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("training stopped: step [0-9]+: the loss is (nan|inf)"))) << r.output;
  ASSERT_TRUE(fs::exists(dir / "checkpoints" / "latest")) << r.output;
  // It loads (checksums, shapes and finite values verified). Its weights
  // are finite but far out, so the next step is not finite again: the
  // resumed run stops at once, naming that step.
  const std::string latest = testing::read_text(dir / "checkpoints" / "latest");
  const long long step = std::stoll(latest.substr(latest.find('-') + 1));
  const testing::process_result resumed =
      testing::run_cli({"--model", config, "--cpus", "2", "--resume", "checkpoints"}, dir.path());
  EXPECT_EQ(resumed.exit_code, 5) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from checkpoints/" + latest.substr(0, latest.find('\n'))), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("training stopped: step " + std::to_string(step + 1) + ": "), std::string::npos)
      << resumed.output;
}

TEST_F(Cli, AThreadStuckForGoodDoesNotHoldTheProgramsExit) {
  // Before: ~actor_system waited for the stuck device thread forever.
  const auto start = std::chrono::steady_clock::now();
  testing::cli_process child({"--model", "job.cfg", "--cpus", "1", "--inject", "stuck:0@3", "--set",
                              "cluster.hang_timeout_s=0.3", "--set", "train.checkpoint_every=1"},
                             dir.path());
  const testing::process_result r = child.wait(std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("shutdown: 1 actor still running after 10 s, left behind: cpu:0 (last seen in forward of step 3"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the newest checkpoint is checkpoints/step-00000002"), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(90));
}

TEST_F(Cli, AFaultSpecForADeviceThatDoesNotExistIsRefused) {
  expect_failure({"--model", "job.cfg", "--cpus", "2", "--inject", "fail:7@3"}, 2,
                 "fail:7@3: there is no device 7: the run has devices 0 to 1");
  expect_failure({"--model", "job.cfg", "--cpus", "2", "--inject", "join:cpu@2", "--inject", "hang:3@5"}, 2,
                 "hang:3@5: there is no device 3: the run has devices 0 to 1 and 1 joining (2)");
  // kill ends its device's process: never this one's.
  expect_failure({"--model", "job.cfg", "--cpus", "2", "--inject", "kill:1@3"}, 2,
                 "kill:1@3: kill ends the process of the device it names, so it names a device of a worker process");
  // The device that joins is device 2: a fault for it is accepted.
  const testing::process_result ok = testing::run_cli(
      {"--model", "job.cfg", "--cpus", "2", "--inject", "join:cpu@2", "--inject", "slow:2:1.5@3"}, dir.path());
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

TEST_F(Cli, AnOutOfRangeTimeoutIsRefusedNamingTheRange) {
  // Before: 1e10 s overflowed the clock's nanoseconds.
  expect_failure({"--model", "job.cfg", "--set", "cluster.collective_timeout_s=1e10"}, 2,
                 "cluster.collective_timeout_s: value 1e+10 is out of range: must be > 0.0 and <= 604800.0");
}

}  // namespace
}  // namespace dpactor
