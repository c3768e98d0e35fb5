// Nothing a user did before is lost, and nothing a user gave is misread:
// a second run into one checkpoint directory replaces none of the first's
// checkpoints (See Note [A run owns its checkpoints]), a checkpoint resumes
// only on its own data (See Note [A checkpoint knows its data]), conflicting
// flags are refused naming both, and every metrics file ends with a summary
// record saying how the run ended (See Note [The summary record is last]).

#include <gtest/gtest.h>

#include <map>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "tests/cli_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;
using testing::Cli;

// Every file under `root` with its bytes, by relative path.
std::map<std::string, std::string> files_of(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(root))
    if (entry.is_regular_file()) files[fs::relative(entry.path(), root).string()] = testing::read_text(entry.path());
  return files;
}

// The last line of a text file.
std::string last_line(const fs::path& file) {
  std::string text = testing::read_text(file);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

TEST_F(Cli, ASecondRunIntoOneDirectoryRefusesAndTheFirstRunsCheckpointsStayByteIdentical) {
  const auto first = testing::run_cli({"--model", "job.cfg", "--cpus", "2", "--set", "train.checkpoint_every=2"}, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = files_of(dir / "checkpoints");
  ASSERT_GE(before.size(), 6u) << "the first run wrote several checkpoints";

  // The same command again, and a changed config: both refused before
  // training, naming the directory, the newest checkpoint and the ways on.
  for (const std::vector<std::string>& extra : {std::vector<std::string>{},
                                                std::vector<std::string>{"--set", "optimizer.lr=0.01"}}) {
    std::vector<std::string> args{"--model", "job.cfg", "--cpus", "2", "--metrics", "m.jsonl"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto again = testing::run_cli(args, dir.path());
    EXPECT_EQ(again.exit_code, 4) << again.output;
    for (const char* fragment : {"checkpoint directory checkpoints holds the checkpoints of another run",
                                 "the newest of step 10", "--resume latest", "--checkpoint-dir",
                                 "--overwrite-checkpoints"})
      EXPECT_NE(again.output.find(fragment), std::string::npos) << fragment << " in:\n" << again.output;
    EXPECT_EQ(again.output.find("epoch 1"), std::string::npos) << "it trained: " << again.output;
    EXPECT_EQ(files_of(dir / "checkpoints"), before) << "the first run's checkpoints changed";
    const std::string summary = last_line(dir / "m.jsonl");
    EXPECT_NE(summary.find(R"("ended":"failed")"), std::string::npos) << summary;
    EXPECT_NE(summary.find(R"("exit_code":4)"), std::string::npos) << summary;
  }

  // What the message offers works: continuing the run ...
  const auto resumed = testing::run_cli({"--model", "job.cfg", "--cpus", "2", "--epochs", "3", "--resume", "latest"},
                                        dir.path());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(15 steps, 3 epochs)"), std::string::npos) << resumed.output;
  // ... (what it added is new; what was there is untouched) ...
  for (const auto& [name, bytes] : before) {
    if (name == "latest" || name == ".lock") continue;  // the newest's name, and the lock of the run that holds it
    EXPECT_EQ(testing::read_text(dir / "checkpoints" / name), bytes) << name;
  }
  // ... and replacing them with consent.
  const auto replaced =
      testing::run_cli({"--model", "job.cfg", "--cpus", "2", "--overwrite-checkpoints"}, dir.path());
  EXPECT_EQ(replaced.exit_code, 0) << replaced.output;
}

// The README's first command, twice (shortened to a few steps).
TEST_F(Cli, TheDefaultCommandTwiceLeavesTheFirstRunsCheckpointsByteIdentical) {
  const std::string config = std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg";
  const std::vector<std::string> command{"--gpus", "all", "--model", config, "--set", "train.max_steps=4",
                                         "--set", "train.checkpoint_every=2"};
  const auto first = testing::run_cli(command, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = files_of(dir / "checkpoints");
  const auto second = testing::run_cli(command, dir.path());
  EXPECT_EQ(second.exit_code, 4) << second.output;
  EXPECT_NE(second.output.find("holds the checkpoints of another run (2, the newest of step 4)"), std::string::npos)
      << second.output;
  EXPECT_EQ(files_of(dir / "checkpoints"), before);
}

TEST_F(Cli, AResumeFromAnEarlierCheckpointWouldReplaceLaterOnesAndIsRefused) {
  const auto first = testing::run_cli(
      {"--model", "job.cfg", "--cpus", "1", "--set", "train.checkpoint_every=2", "--set", "train.keep_checkpoints=0"},
      dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = files_of(dir / "checkpoints");
  const auto earlier = testing::run_cli({"--model", "job.cfg", "--cpus", "1", "--resume", "checkpoints/step-00000004"},
                                        dir.path());
  EXPECT_EQ(earlier.exit_code, 4) << earlier.output;
  EXPECT_NE(earlier.output.find("holds checkpoints after the one this run resumes from (step 4; the newest is of step 10)"),
            std::string::npos)
      << earlier.output;
  EXPECT_EQ(files_of(dir / "checkpoints"), before);
}

// The same rule through the library: Engine::start refuses before anything
// trains, and run_options::overwrite_checkpoints is the consent.
TEST(CheckpointOwnership, AnEngineRefusesADirectoryWithAnotherRunsCheckpointsUnlessTold) {
  testing::scratch_dir dir;
  job_config job = testing::small_job(2, 64, 512);
  job.train.checkpoint_dir = (dir / "ck").string();
  {
    Engine first(job);
    first.start();
    first.wait();
  }
  const auto before = files_of(dir / "ck");
  Engine second(job);
  try {
    second.start();
    second.wait();
    ADD_FAILURE() << "the second run started";
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find("holds the checkpoints of another run"), std::string::npos) << e.what();
  }
  EXPECT_EQ(files_of(dir / "ck"), before);
  run_options consent;
  consent.overwrite_checkpoints = true;
  Engine third(job, consent);
  third.start();
  EXPECT_EQ(third.wait().steps, 8);
}

TEST_F(Cli, ACheckpointResumesOnlyOnItsOwnDataUnlessTheUserSaysSo) {
  const auto first = testing::run_cli({"--model", "job.cfg", "--cpus", "1"}, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Other data of the same shape: the pixels change, the sizes do not.
  std::vector<std::uint8_t> pixels(40 * 8), labels(40);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 7 + 1);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::uint8_t>(i % 3);
  testing::write_text(dir / "other.idx", testing::idx_bytes(0x08, {40, 8}, pixels));
  const std::string other = "train_images = \"" + (dir / "other.idx").string() + "\"\ntrain_labels = \"" +
                            (dir / "labels.idx").string() + "\"\ntest_images = \"" + (dir / "images.idx").string() +
                            "\"\ntest_labels = \"" + (dir / "labels.idx").string() + "\"\n";
  write_config("", other);
  const auto refused = testing::run_cli({"--model", "job.cfg", "--cpus", "1", "--epochs", "3", "--resume", "latest"},
                                        dir.path());
  EXPECT_EQ(refused.exit_code, 4) << refused.output;
  // Both fingerprints, the checkpoint's first.
  const auto trained_on = refused.output.find("the checkpoint was trained on data with fingerprint train 40 x 8");
  const auto this_run = refused.output.find("this run's data has train 40 x 8");
  EXPECT_NE(trained_on, std::string::npos) << refused.output;
  EXPECT_NE(this_run, std::string::npos) << refused.output;
  EXPECT_LT(trained_on, this_run) << refused.output;
  EXPECT_NE(refused.output.find("train.resume_other_data = true"), std::string::npos) << refused.output;

  const auto allowed = testing::run_cli({"--model", "job.cfg", "--cpus", "1", "--epochs", "3", "--resume", "latest",
                                         "--set", "train.resume_other_data=true"},
                                        dir.path());
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;
  const std::string warning = "resume_other_data = true: resuming on this data";
  const auto at = allowed.output.find(warning);
  EXPECT_NE(at, std::string::npos) << allowed.output;
  EXPECT_EQ(allowed.output.find(warning, at + 1), std::string::npos) << "one warning: " << allowed.output;
  EXPECT_NE(allowed.output.find("(15 steps, 3 epochs)"), std::string::npos) << allowed.output;
}

TEST_F(Cli, ResumeWithInitFromIsRefusedNamingBoth) {
  expect_failure({"--model", "job.cfg", "--resume", "checkpoints", "--init-from", "w.safetensors"}, 2,
                 "--resume and --init-from: both say where the run starts: --resume checkpoints continues a run");
}

TEST_F(Cli, AFailedRunsMetricsEndWithItsSummarySayingHowItEnded) {
  const auto r = testing::run_cli({"--model", "job.cfg", "--cpus", "1", "--set", "optimizer.lr=1e30", "--metrics",
                                   "m.jsonl"},
                                  dir.path());
  EXPECT_EQ(r.exit_code, 5) << r.output;
  const std::string summary = last_line(dir / "m.jsonl");
  EXPECT_EQ(summary.rfind(R"({"event":"summary")", 0), 0u) << summary;
  for (const char* fragment : {R"("ended":"failed")", R"("exit_code":5)", "training stopped: step",
                               R"("checkpoint":"checkpoints/step-)"})
    EXPECT_NE(summary.find(fragment), std::string::npos) << fragment << " in " << summary;
  // A finished run's ends the same way.
  const auto ok = testing::run_cli({"--model", "job.cfg", "--cpus", "1", "--metrics", "m.jsonl",
                                    "--checkpoint-dir", "other"},
                                   dir.path());
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const std::string finished = last_line(dir / "m.jsonl");
  EXPECT_NE(finished.find(R"("ended":"finished")"), std::string::npos) << finished;
  EXPECT_NE(finished.find(R"("exit_code":0)"), std::string::npos) << finished;
}

// See Note [Memory before allocating]: sizes that cannot be met are the
// user's mistake, refused before anything is allocated, with the estimate;
// never std::bad_alloc (an "internal error", exit 1).
TEST_F(Cli, ImpossibleSizesAreRefusedWithTheEstimateBeforeAnythingIsAllocated) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--set", "model.layers=[8, 16000000, 16000000, 3]"}, "per replica"},
      {{"--set", "train.micro_batch=2000000000"}, "a micro-batch of 2000000000 rows"},
      {{"--set", "data.format=\"synthetic\"", "--set", "data.synthetic_train=4000000000",
        "--set", "model.layers=[16, 6, 4]"},
       "(data "},
  };
  for (const auto& [extra, fragment] : cases) {
    std::vector<std::string> args{"--model", "job.cfg", "--cpus", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = testing::run_cli(args, dir.path());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("the job needs about "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << fragment << " in:\n" << r.output;
    EXPECT_NE(r.output.find("available ("), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("bad_alloc"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "checkpoints")) << "a refused job left a checkpoint directory";
  }
  // A GPU count far beyond any machine is not a list of that many GPUs: on
  // a machine without one it is the CPU fallback, at once.
  const auto gpus = testing::run_cli({"--model", "job.cfg", "--gpus", "2000000000", "--print-config"}, dir.path());
  EXPECT_EQ(gpus.exit_code, 0) << gpus.output;
}

}  // namespace
}  // namespace dpactor
