// Checkpoint directories: round trip, `latest`, pruning, atomic writes, and
// clear errors for missing or corrupt checkpoints and weights files.

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>

#include "train/checkpoint.hpp"
#include "train/checkpoint_checksum.hpp"
#include "train/checkpoint_directory.hpp"
#include <dpactor/error.hpp>
#include "tensors/safetensors.hpp"
#include "tests/test_support.hpp"
#include "tensors/json.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;

struct fixture {
  mlp_spec spec{{6, 5, 3}, activation::relu, loss_kind::cross_entropy};
  state_layout layout = make_state_layout(spec, optimizer_config{});
  std::vector<float> state = [this] {
    std::vector<float> s(layout.total_size());
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i) * 0.5f;
    write_step_counter(s, layout, 77);
    return s;
  }();
  // The record's step and the state's step counter, which a checkpoint
  // keeps equal.
  void set_step(std::int64_t step) {
    record.step = step;
    write_step_counter(state, layout, step);
  }
  trainer_record record = [] {
    trainer_record r;
    r.step = 77;
    r.position = {3, 40, {5, 9, 1}, {}};
    r.seed = 11;
    r.train_samples = 100;
    r.config = "[train]\nepochs = 4\n";
    return r;
  }();
};

TEST(Checkpoint, RoundTripsStateAndTrainerRecord) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  EXPECT_EQ(written.filename(), "step-00000077");
  EXPECT_EQ(testing::read_text(dir / "latest"), "step-00000077\n");
  for (const auto& path : {dir.path(), written}) {
    const loaded_checkpoint ckpt = read_checkpoint(path, fx.layout);
    EXPECT_EQ(ckpt.directory, written);
    // Padding is not stored; compare tensor by tensor, and the step counter.
    for (const auto& t : fx.layout.layout.tensors())
      for (std::size_t i = t.offset; i < t.offset + t.numel(); ++i) ASSERT_EQ(ckpt.state[i], fx.state[i]) << t.name;
    EXPECT_EQ(read_step_counter(ckpt.state, fx.layout), 77);
    EXPECT_EQ(ckpt.record.position.cursor, 40u);
    EXPECT_EQ(ckpt.record.position.front, (std::vector<std::uint32_t>{5, 9, 1}));
    EXPECT_EQ(ckpt.record.seed, 11u);
    EXPECT_EQ(ckpt.record.config, fx.record.config);
  }
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << entry.path();
}

TEST(Checkpoint, NumbersOutOfRangeAreRefusedOnRead) {
  // Before: an absurd step count resumed. The trainer records are edited on
  // disk, their checksum made again, as a buggy or hostile writer would.
  const fixture fx;
  const auto refused = [&](const std::function<void(json&)>& edit, const std::string& fragment) {
    testing::scratch_dir dir;
    const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
    json doc = json::parse(testing::read_text(written / "trainer.json"));
    doc.erase("crc32");
    edit(doc);
    doc["crc32"] = crc32_hex(doc.dump());
    testing::write_text(written / "trainer.json", doc.dump());
    try {
      read_checkpoint(dir.path(), fx.layout);
      ADD_FAILURE() << "accepted; expected: " << fragment;
    } catch (const checkpoint_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  refused([](json& d) { d["step"] = std::int64_t{1} << 50; }, "step 1125899906842624 is out of range");
  refused([](json& d) { d["step"] = 76; }, "step 77 disagrees with trainer.json's step 76");
  refused([](json& d) { d["ledger"]["cursor"] = 101; }, "ledger cursor 101 is beyond the 100 training samples");
  refused([](json& d) { d["ledger"]["front"] = json::array({5, 100}); }, "ledger index 100 is beyond the 100 training samples");
  refused([](json& d) { d["ledger"]["epoch"] = d["epoch"] = -1; }, "epoch -1 is out of range for step 77");
  refused([](json& d) { d["train_samples"] = 0; }, "train_samples is 0");
  refused([](json& d) { d["epoch"] = d["ledger"]["epoch"].get<std::int64_t>() + 1; }, "disagrees with ledger.epoch");
  // A writer never writes them: a record that disagrees does not read back.
  testing::scratch_dir dir;
  trainer_record r = fx.record;
  r.step = 76;
  EXPECT_THROW(write_checkpoint(dir.path(), fx.layout, fx.state, r), checkpoint_error);
  EXPECT_FALSE(fs::exists(dir / "latest"));
}

TEST(Checkpoint, ANewCheckpointThatDoesNotReadBackNeverBecomesLatestNorPrunesAnOlderOne) {
  testing::scratch_dir dir;
  fixture fx;
  checkpoint_directory ckpts(dir.path());
  ckpts.write(fx.layout, fx.state, fx.record, 1);
  // The next write's files are damaged on their way to the disk.
  set_checkpoint_crash_hook([&](std::string_view point) {
    if (point != "directory synced") return;
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().filename().string().starts_with(checkpoint_tmp_prefix)) {
        std::fstream f(e.path() / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-3, std::ios::end);
        f.put('\x7f');
      }
  });
  trainer_record next = fx.record;
  next.step = 78;
  std::vector<float> state = fx.state;
  write_step_counter(state, fx.layout, 78);
  try {
    ckpts.write(fx.layout, state, next, 1);
    ADD_FAILURE() << "a checkpoint that does not read back was accepted";
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not read back"), std::string::npos) << e.what();
  }
  set_checkpoint_crash_hook({});
  EXPECT_EQ(read_checkpoint(dir.path(), fx.layout).record.step, 77) << "latest still names the verified one";
  EXPECT_FALSE(fs::exists(dir / "step-00000078"));
}

TEST(Checkpoint, KeepsOnlyTheNewest) {
  testing::scratch_dir dir;
  fixture fx;
  checkpoint_directory run(dir.path());
  for (std::int64_t step : {10, 20, 30, 40}) {
    fx.set_step(step);
    run.write(fx.layout, fx.state, fx.record, 2);
  }
  EXPECT_FALSE(fs::exists(dir / "step-00000010"));
  EXPECT_FALSE(fs::exists(dir / "step-00000020"));
  EXPECT_TRUE(fs::exists(dir / "step-00000030"));
  EXPECT_TRUE(fs::exists(dir / "step-00000040"));
  EXPECT_EQ(testing::read_text(dir / "latest"), "step-00000040\n");
}

TEST(CheckpointDirectory, PrunesOnlyCheckpointsThisRunWrote) {
  testing::scratch_dir dir;
  fixture fx;
  fx.set_step(5);
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);  // an earlier run's
  fs::create_directories(dir / "step-99999999" / "notes");        // a folder of the user's
  {
    // Only with the user's consent may a run write into a directory that
    // holds another run's checkpoints (See Note [A run owns its
    // checkpoints]); it still prunes only its own.
    checkpoint_directory run(dir.path(), checkpoint_claim{std::nullopt, true});
    for (std::int64_t step : {10, 20, 30}) {
      fx.set_step(step);
      run.write(fx.layout, fx.state, fx.record, 1);
    }
  }
  EXPECT_TRUE(fs::exists(dir / "step-00000005")) << "an earlier run's checkpoint was pruned";
  EXPECT_TRUE(fs::exists(dir / "step-99999999" / "notes")) << "a folder of the user's was pruned";
  EXPECT_FALSE(fs::exists(dir / "step-00000010"));
  EXPECT_FALSE(fs::exists(dir / "step-00000020"));
  EXPECT_TRUE(fs::exists(dir / "step-00000030"));
}

TEST(CheckpointDirectory, ASecondRunIsRefusedNamingTheHoldersPid) {
  testing::scratch_dir dir;
  checkpoint_directory first(dir.path());
  const std::string message = testing::error_of<checkpoint_error>([&] { checkpoint_directory second(dir.path()); });
  EXPECT_NE(message.find(dir.path().string() + " is in use by another run (pid " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << message;
}

TEST(CheckpointDirectory, TheLockIsReleasedWithTheRun) {
  testing::scratch_dir dir;
  { checkpoint_directory first(dir.path()); }
  EXPECT_NO_THROW(checkpoint_directory second(dir.path()));
}

TEST(CheckpointDirectory, ADirectoryThatCannotBeCreatedIsRefusedAtOnce) {
  testing::scratch_dir dir;
  testing::write_text(dir / "a-file", "");
  const std::string message = testing::error_of<checkpoint_error>([&] { checkpoint_directory run(dir / "a-file" / "ckpt"); });
  EXPECT_NE(message.find("cannot create checkpoint directory " + (dir / "a-file" / "ckpt").string()), std::string::npos)
      << message;
}

TEST(CheckpointDirectory, TemporaryFoldersOfDeadRunsAreRemovedUnderTheLock) {
  testing::scratch_dir dir;
  fs::create_directories(dir / ".tmp-step-00000010-4242");
  testing::write_text(dir / ".tmp-step-00000010-4242" / "model.safetensors", "partial");
  checkpoint_directory run(dir.path());
  EXPECT_EQ(run.stale_removed(), 1u);
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-00000010-4242"));
}

TEST(Checkpoint, RewritingAStepSwapsInTheNewCheckpoint) {
  testing::scratch_dir dir;
  fixture fx;
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  std::vector<float> changed = fx.state;
  changed[0] = 1234.5f;
  const fs::path again = write_checkpoint(dir.path(), fx.layout, changed, fx.record);
  EXPECT_EQ(read_checkpoint(dir.path(), fx.layout).state[0], 1234.5f);
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << entry.path();
}

TEST(Checkpoint, AFlippedBitAnywhereInACheckpointIsRefused) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "trainer.json"}) {
    const fs::path file = written / name;
    const std::string original = testing::read_text(file);
    for (std::size_t i = 0; i < original.size(); ++i) {
      for (const int bit : {0, 6}) {
        std::string damaged = original;
        damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
        testing::write_text(file, damaged);
        bool refused = false;
        try {
          read_checkpoint(dir.path(), fx.layout);
        } catch (const checkpoint_error& e) {
          refused = std::string(e.what()).find(file.string()) != std::string::npos;
        }
        EXPECT_TRUE(refused) << name << ": bit " << bit << " of byte " << i << " of " << original.size()
                             << " flipped, and the checkpoint loaded (or the error did not name the file)";
      }
    }
    testing::write_text(file, original);
  }
  EXPECT_NO_THROW(read_checkpoint(dir.path(), fx.layout));
}

// A crash at each point of a checkpoint's write, over an earlier checkpoint:
// a child process writes and dies there (as kill -9 or a power cut would end
// it); `latest` must then name a complete checkpoint, the old or the new.
class CheckpointCrash : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointCrash, LeavesAResumableCheckpoint) {
  testing::scratch_dir dir;
  fixture fx;
  fx.set_step(10);
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  const std::string point = GetParam();
  for (const std::int64_t step : {std::int64_t{20}, std::int64_t{10}}) {  // a new step; the same step rewritten
    SCOPED_TRACE("writing step " + std::to_string(step) + ", crash at " + point);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      set_checkpoint_crash_hook([&](std::string_view at) {
        if (at == point) ::_exit(0);
      });
      std::vector<float> changed = fx.state;
      changed[0] = 99.0f;
      write_step_counter(changed, fx.layout, step);
      trainer_record r = fx.record;
      r.step = step;
      write_checkpoint(dir.path(), fx.layout, changed, r);
      ::_exit(3);  // the point was never reached
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the crash point was not reached";
    const loaded_checkpoint c = read_checkpoint(dir.path(), fx.layout);
    EXPECT_TRUE(c.state[0] == fx.state[0] || c.state[0] == 99.0f);
    // The newest checkpoint written whole: the first, or one of this test's
    // (step 20 stays whole once renamed, also while step 10 is rewritten).
    EXPECT_TRUE(c.record.step == 10 || c.record.step == 20) << c.record.step;
    // The next run, resumed from the newest checkpoint written whole, cleans
    // up what the dead one left.
    std::int64_t newest = 0;
    for (const auto& entry : fs::directory_iterator(dir.path()))
      if (entry.path().filename().string().rfind("step-", 0) == 0 && fs::exists(entry.path() / "trainer.json"))
        newest = std::max<std::int64_t>(newest, std::stoll(entry.path().filename().string().substr(5)));
    checkpoint_directory next(dir.path(), checkpoint_claim{newest, false});
    for (const auto& entry : fs::directory_iterator(dir.path()))
      EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << entry.path();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, CheckpointCrash,
                         ::testing::Values("model written", "optimizer written", "trainer written", "directory synced",
                                           "renamed", "latest written", "latest renamed"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ' ', '_');
                           return name;
                         });

TEST(Checkpoint, MissingCheckpointIsNamed) {
  fixture fx;
  EXPECT_NE(testing::error_of<checkpoint_error>([&] { read_checkpoint("/nonexistent/ckpt", fx.layout); }).find("/nonexistent/ckpt: no such checkpoint"),
            std::string::npos);
}

TEST(Checkpoint, TruncatedModelFileIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  const std::string bytes = testing::read_text(written / "model.safetensors");
  testing::write_text(written / "model.safetensors", bytes.substr(0, bytes.size() - 10));
  const std::string msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(dir.path(), fx.layout); });
  EXPECT_NE(msg.find("model.safetensors: not a valid safetensors file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Checkpoint, BadHeaderIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  std::string bytes = testing::read_text(written / "optimizer.safetensors");
  bytes[10] = '#';
  testing::write_text(written / "optimizer.safetensors", bytes);
  const std::string msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("optimizer.safetensors: not a valid safetensors file: header"), std::string::npos) << msg;
}

TEST(Checkpoint, CorruptTrainerRecordIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  testing::write_text(written / "trainer.json", "{\"format\": \"dpactor-checkpoint-1\"}");
  const std::string msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("trainer.json: corrupt trainer record"), std::string::npos) << msg;
}

TEST(Checkpoint, MalformedTrainerJsonIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  const std::string good = testing::read_text(written / "trainer.json");
  testing::write_text(written / "trainer.json", good.substr(0, good.size() / 2));
  std::string msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("trainer.json: corrupt trainer record"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parse error"), std::string::npos) << msg;
  // A step count that is not an integer is corrupt too.
  std::string fractional = good;
  const auto at = fractional.find("\"step\":");
  ASSERT_NE(at, std::string::npos) << good;
  fractional.insert(fractional.find_first_of(",}", at), ".5");
  testing::write_text(written / "trainer.json", fractional);
  msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("trainer.json: checksum mismatch"), std::string::npos) << msg;
  // Without the checksum (a format-1 checkpoint, written before checksums),
  // the value itself is refused.
  std::string unchecked = fractional;
  unchecked.replace(unchecked.find("dpactor-checkpoint-2"), 20, "dpactor-checkpoint-1");
  unchecked.erase(unchecked.find(",\"crc32\""), std::string(",\"crc32\":\"00000000\"").size());
  testing::write_text(written / "trainer.json", unchecked);
  msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("step: expected an integer"), std::string::npos) << msg;
}

TEST(Checkpoint, ShapeMismatchNamesTheTensor) {
  testing::scratch_dir dir;
  fixture fx;
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  const state_layout other = make_state_layout(mlp_spec{{6, 4, 3}, activation::relu, loss_kind::cross_entropy}, optimizer_config{});
  const std::string msg = testing::error_of<checkpoint_error>([&] { read_checkpoint(dir.path(), other); });
  EXPECT_NE(msg.find("tensor \"0.weight\" has shape [5, 6], the model needs [4, 6]"), std::string::npos) << msg;
}

TEST(ModelWeights, MissingTensorAndWrongShapeAreNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const std::vector<float> w(30, 1.0f), b(5, 0.0f);
  save_safetensors(dir / "partial.safetensors", {{"0.weight", {5, 6}, w}, {"0.bias", {5}, b}}, {});
  EXPECT_NE(testing::error_of<checkpoint_error>([&] { read_model_weights(dir / "partial.safetensors", fx.layout); }).find("tensor \"2.weight\" is missing"),
            std::string::npos);
  save_safetensors(dir / "wrong.safetensors", {{"0.weight", {6, 5}, w}}, {});
  EXPECT_NE(testing::error_of<checkpoint_error>([&] { read_model_weights(dir / "wrong.safetensors", fx.layout); })
                .find("wrong.safetensors: tensor \"0.weight\" has shape [6, 5], the model needs [5, 6]"),
            std::string::npos);
}

TEST(Checkpoint, FailedWriteLeavesNothingBehind) {
  testing::scratch_dir dir;
  fixture fx;
  fx.set_step(5);
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
  // A child process whose files may not grow past 100 bytes: the next
  // checkpoint fails part-way through its first file (works as root too).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100, 100};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    fx.set_step(6);
    try {
      write_checkpoint(dir.path(), fx.layout, fx.state, fx.record);
    } catch (const checkpoint_error&) {
      ::_exit(0);
    }
    ::_exit(1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the write did not fail with checkpoint_error";
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000005"})) << "no partial checkpoint, latest unchanged";
  EXPECT_EQ(testing::read_text(dir / "latest"), "step-00000005\n");
}

}  // namespace
}  // namespace dpactor
