// Checkpoint directories: round trip, `latest`, pruning, atomic writes, and
// clear errors for missing or corrupt checkpoints and weights files.

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>

#include "train/checkpoint.hpp"
#include "tensors/error.hpp"
#include "tensors/safetensors.hpp"
#include "tests/test_support.hpp"

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
  trainer_record record = [] {
    trainer_record r;
    r.step = 77;
    r.position = {3, 40, {5, 9, 1}};
    r.seed = 11;
    r.train_samples = 100;
    r.config = "[train]\nepochs = 4\n";
    return r;
  }();
};

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Checkpoint, RoundTripsStateAndTrainerRecord) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
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

TEST(Checkpoint, KeepsOnlyTheNewest) {
  testing::scratch_dir dir;
  fixture fx;
  for (std::int64_t step : {10, 20, 30, 40}) {
    fx.record.step = step;
    write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 2);
  }
  EXPECT_FALSE(fs::exists(dir / "step-00000010"));
  EXPECT_FALSE(fs::exists(dir / "step-00000020"));
  EXPECT_TRUE(fs::exists(dir / "step-00000030"));
  EXPECT_TRUE(fs::exists(dir / "step-00000040"));
  EXPECT_EQ(testing::read_text(dir / "latest"), "step-00000040\n");
}

TEST(Checkpoint, MissingCheckpointIsNamed) {
  fixture fx;
  EXPECT_NE(error_of([&] { read_checkpoint("/nonexistent/ckpt", fx.layout); }).find("/nonexistent/ckpt: no such checkpoint"),
            std::string::npos);
}

TEST(Checkpoint, TruncatedModelFileIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
  const std::string bytes = testing::read_text(written / "model.safetensors");
  testing::write_text(written / "model.safetensors", bytes.substr(0, bytes.size() - 10));
  const std::string msg = error_of([&] { read_checkpoint(dir.path(), fx.layout); });
  EXPECT_NE(msg.find("model.safetensors: not a valid safetensors file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Checkpoint, BadHeaderIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
  std::string bytes = testing::read_text(written / "optimizer.safetensors");
  bytes[10] = '#';
  testing::write_text(written / "optimizer.safetensors", bytes);
  const std::string msg = error_of([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("optimizer.safetensors: not a valid safetensors file: header"), std::string::npos) << msg;
}

TEST(Checkpoint, CorruptTrainerRecordIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
  testing::write_text(written / "trainer.json", "{\"format\": \"dpactor-checkpoint-1\"}");
  const std::string msg = error_of([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("trainer.json: corrupt trainer record"), std::string::npos) << msg;
}

TEST(Checkpoint, MalformedTrainerJsonIsNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const fs::path written = write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
  const std::string good = testing::read_text(written / "trainer.json");
  testing::write_text(written / "trainer.json", good.substr(0, good.size() / 2));
  std::string msg = error_of([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("trainer.json: corrupt trainer record"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parse error"), std::string::npos) << msg;
  // A step count that is not an integer is corrupt too.
  std::string fractional = good;
  const auto at = fractional.find("\"step\":");
  ASSERT_NE(at, std::string::npos) << good;
  fractional.insert(fractional.find_first_of(",}", at), ".5");
  testing::write_text(written / "trainer.json", fractional);
  msg = error_of([&] { read_checkpoint(written, fx.layout); });
  EXPECT_NE(msg.find("step: expected an integer"), std::string::npos) << msg;
}

TEST(Checkpoint, ShapeMismatchNamesTheTensor) {
  testing::scratch_dir dir;
  fixture fx;
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
  const state_layout other = make_state_layout(mlp_spec{{6, 4, 3}, activation::relu, loss_kind::cross_entropy}, optimizer_config{});
  const std::string msg = error_of([&] { read_checkpoint(dir.path(), other); });
  EXPECT_NE(msg.find("tensor \"0.weight\" has shape [5, 6], the model needs [4, 6]"), std::string::npos) << msg;
}

TEST(ModelWeights, MissingTensorAndWrongShapeAreNamed) {
  testing::scratch_dir dir;
  fixture fx;
  const std::vector<float> w(30, 1.0f), b(5, 0.0f);
  save_safetensors(dir / "partial.safetensors", {{"0.weight", {5, 6}, w}, {"0.bias", {5}, b}}, {});
  EXPECT_NE(error_of([&] { read_model_weights(dir / "partial.safetensors", fx.layout); }).find("tensor \"2.weight\" is missing"),
            std::string::npos);
  save_safetensors(dir / "wrong.safetensors", {{"0.weight", {6, 5}, w}}, {});
  EXPECT_NE(error_of([&] { read_model_weights(dir / "wrong.safetensors", fx.layout); })
                .find("wrong.safetensors: tensor \"0.weight\" has shape [6, 5], the model needs [5, 6]"),
            std::string::npos);
}

TEST(Checkpoint, FailedWriteLeavesNothingBehind) {
  testing::scratch_dir dir;
  fixture fx;
  fx.record.step = 5;
  write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
  // A child process whose files may not grow past 100 bytes: the next
  // checkpoint fails part-way through its first file (works as root too).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100, 100};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    fx.record.step = 6;
    try {
      write_checkpoint(dir.path(), fx.layout, fx.state, fx.record, 0);
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
