// Config files: the schema's checks and their messages (file:line:column and
// the key), --set overrides, and the documentation of every key.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "config/config_file.hpp"
#include <dpactor/error.hpp>
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

// The config_error that parsing `text` (a job.cfg) with `sets` gives.
std::string parse_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  return testing::error_of<config_error>([&] { parse_job_config(text, "job.cfg", sets); });
}

TEST(Config, DefaultJobFileParses) {
  const job_config c = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  EXPECT_EQ(c.model.sizes, (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(c.model.hidden_activation, activation::relu);
  EXPECT_EQ(c.optimizer.kind, optimizer_kind::sgd);
  EXPECT_GE(c.train.epochs, 1);
}

TEST(Config, ReadsEveryKindOfValue) {
  const job_config c = parse_job_config(R"(
[model]
layers = [10, 20, 3]
activation = "gelu"
loss = "mse"
[optimizer]
name = "adamw"
lr = 3e-4
nesterov = false
[train]
epochs = 3
shuffle = false
[cluster]
collective_timeout_s = 5
)",
                                        "job.cfg");
  EXPECT_EQ(c.model.sizes, (std::vector<int>{10, 20, 3}));
  EXPECT_EQ(c.model.hidden_activation, activation::gelu);
  EXPECT_EQ(c.model.loss, loss_kind::mse);
  EXPECT_EQ(c.optimizer.kind, optimizer_kind::adamw);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_FALSE(c.train.shuffle);
  EXPECT_DOUBLE_EQ(c.cluster.collective_timeout_s, 5.0) << "an integer is accepted for a float key";
}

TEST(Config, MalformedTomlNamesLineAndColumn) {
  const std::string msg = parse_error("[train]\nepochs = = 3\n");
  EXPECT_NE(msg.find("job.cfg:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed TOML"), std::string::npos) << msg;
}

TEST(Config, UnknownKeyIsNamedWithASuggestion) {
  const std::string msg = parse_error("[train]\nepochs = 3\nepoch = 4\n");
  EXPECT_NE(msg.find("job.cfg:3:9: train.epoch: unknown key (did you mean 'train.epochs'?)"), std::string::npos) << msg;
}

TEST(Config, UnknownSectionIsNamed) {
  const std::string msg = parse_error("[trian]\nepochs = 3\n");
  EXPECT_NE(msg.find("job.cfg:1:1: trian: unknown section [trian]"), std::string::npos) << msg;
}

TEST(Config, WrongTypeIsNamed) {
  const std::string msg = parse_error("[train]\nepochs = \"ten\"\n");
  EXPECT_NE(msg.find("job.cfg:2:10: train.epochs: expected an integer, found a string"), std::string::npos) << msg;
}

TEST(Config, NegativeLearningRateIsOutOfRange) {
  const std::string msg = parse_error("[optimizer]\nlr = -0.1\n");
  EXPECT_NE(msg.find("job.cfg:2:6: optimizer.lr: value -0.1 is out of range: must be > 0.0"), std::string::npos) << msg;
}

TEST(Config, UnknownChoiceListsTheChoices) {
  const std::string msg = parse_error("[optimizer]\nname = \"adam\"\n");
  EXPECT_NE(msg.find("optimizer.name: unknown value \"adam\": expected one of \"sgd\", \"adamw\""), std::string::npos) << msg;
}

TEST(Config, LayerEntriesAreChecked) {
  EXPECT_NE(parse_error("[model]\nlayers = [10]\n").find("needs at least two entries"), std::string::npos);
  EXPECT_NE(parse_error("[model]\nlayers = [10, 0, 2]\n").find("model.layers[1]: value 0 is out of range"), std::string::npos);
}

TEST(Config, ATorchscriptModelNeedsItsFileAndInputShape) {
  EXPECT_NE(parse_error("[model]\nkind = \"torchscript\"\ninput_shape = [16]\n").find("model.kind = \"torchscript\" needs model.path"),
            std::string::npos);
  EXPECT_NE(parse_error("[model]\nkind = \"torchscript\"\npath = \"m.pt\"\n").find("needs model.input_shape"),
            std::string::npos);
  EXPECT_NE(parse_error("[model]\nkind = \"torch\"\n").find("expected one of \"mlp\", \"torchscript\""), std::string::npos);
  EXPECT_NE(parse_error("[model]\ninput_shape = [1, 0]\n").find("model.input_shape[1]: value 0 is out of range"),
            std::string::npos);
}

// model.path is the config file's neighbour, wherever dpactor runs; a --set
// path is the caller's, relative to the working directory.
TEST(Config, ATorchscriptPathIsRelativeToTheConfigFile) {
  const job_config c = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/cnn.cfg");
  EXPECT_EQ(c.module.kind, model_kind::torchscript);
  EXPECT_EQ(c.module.path, std::string(DPACTOR_SOURCE_DIR) + "/configs/cnn.pt");
  EXPECT_EQ(c.module.input_shape, (std::vector<std::int64_t>{1, 28, 28}));
  const job_config set = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/cnn.cfg", {"model.path=\"x.pt\""});
  EXPECT_EQ(set.module.path, "x.pt");
}

TEST(Config, CrossKeyRulesAreChecked) {
  const std::string msg = parse_error("[optimizer]\nmomentum = 0.0\nnesterov = true\n");
  EXPECT_NE(msg.find("optimizer.nesterov = true needs optimizer.momentum > 0"), std::string::npos) << msg;
}

TEST(Config, SetOverridesApplyWithTheSameChecks) {
  const job_config c = parse_job_config("[train]\nepochs = 3\n", "job.cfg",
                                        {"train.epochs=7", "optimizer.name=adamw", "model.layers=[4, 8, 2]"});
  EXPECT_EQ(c.train.epochs, 7);
  EXPECT_EQ(c.optimizer.kind, optimizer_kind::adamw) << "a bare word is a string";
  EXPECT_EQ(c.model.sizes, (std::vector<int>{4, 8, 2}));
  EXPECT_NE(parse_error("", {"train.epochs=abc"}).find("--set train.epochs=abc: train.epochs: expected an integer"),
            std::string::npos);
  EXPECT_NE(parse_error("", {"train.nope=1"}).find("train.nope: unknown key"), std::string::npos);
  EXPECT_NE(parse_error("", {"epochs=1"}).find("expected section.key=value"), std::string::npos);
}

// Found by fuzz/config_fuzz.cpp: a --set value that is not UTF-8 failed both
// readings (as TOML, then as a string) and escaped as a toml::parse_error.
TEST(Config, ASetValueThatIsNotUtf8IsAConfigErrorNamingTheOverride) {
  const std::string msg = parse_error("", {"optimizer.lr=0.\xc5\xf5"});
  EXPECT_NE(msg.find("--set optimizer.lr=0."), std::string::npos) << msg;
  EXPECT_NE(msg.find("neither a TOML value nor a string"), std::string::npos) << msg;
}

TEST(Config, MissingFileIsNamed) {
  try {
    load_job_config("/nonexistent/job.cfg");
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/job.cfg: config file not found"), std::string::npos);
  }
}

TEST(Config, DumpParsesBackToTheSameConfig) {
  job_config c = parse_job_config("[train]\nepochs = 4\n[optimizer]\nlr = 0.0123\n", "job.cfg");
  const job_config back = parse_job_config(dump_job_config(c), "dump");
  EXPECT_EQ(dump_job_config(back), dump_job_config(c));
  EXPECT_DOUBLE_EQ(back.optimizer.lr, 0.0123);
}

// --print-config shows the keys the job reads: a TorchScript job no
// model.layers or activation, an MLP job no model.path or input_shape. The
// shown text loads back as the same job.
TEST(Config, ThePrintedConfigLeavesOutTheOtherModelKindsKeys) {
  const job_config torch = parse_job_config(
      "[model]\nkind = \"torchscript\"\npath = \"/m/cnn.pt\"\ninput_shape = [1, 28, 28]\n", "job.cfg");
  const std::string shown = dump_job_config(torch, dumped_keys::read_by_the_job);
  EXPECT_EQ(shown.find("layers ="), std::string::npos) << shown;
  EXPECT_EQ(shown.find("activation ="), std::string::npos) << shown;
  EXPECT_NE(shown.find("path = \"/m/cnn.pt\"\ninput_shape = [1, 28, 28]\n"), std::string::npos) << shown;
  EXPECT_EQ(dump_job_config(parse_job_config(shown, "shown")), dump_job_config(torch));
  EXPECT_NE(dump_job_config(torch).find("layers ="), std::string::npos) << "the full dump keeps every key";

  const job_config mlp = parse_job_config("[model]\nlayers = [16, 8, 4]\n", "job.cfg");
  const std::string mlp_shown = dump_job_config(mlp, dumped_keys::read_by_the_job);
  EXPECT_NE(mlp_shown.find("[model]\nlayers = [16, 8, 4]\nactivation = \"relu\"\n"), std::string::npos) << mlp_shown;
  EXPECT_EQ(mlp_shown.find("path ="), std::string::npos) << mlp_shown;
  EXPECT_EQ(mlp_shown.find("input_shape ="), std::string::npos) << mlp_shown;
  EXPECT_EQ(dump_job_config(parse_job_config(mlp_shown, "shown")), dump_job_config(mlp));
}

TEST(Config, DocsListEveryKeyWithItsDefault) {
  std::ifstream in(std::string(DPACTOR_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  for (const auto& key : config_keys()) {
    const std::string name = "`" + key.name + "`";
    const auto it = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(name) != std::string::npos; });
    ASSERT_NE(it, lines.end()) << key.name << " is not documented in docs/config.md";
    EXPECT_NE(it->find("`" + key.default_value + "`"), std::string::npos)
        << key.name << ": docs/config.md should give its default `" << key.default_value << "` on the line: " << *it;
  }
}

// The dump is written by toml++: a string with a tab, a newline, a control
// character and a byte-order mark prints on one line with every one of them
// escaped, and reads back as the same config.
TEST(Config, TheDumpEscapesInvisibleCharactersAndReadsBackForAnyString) {
  job_config c;
  c.data.train_file = "a\tb\nc\x01" "d\xef\xbb\xbf\"q\"\\";
  c.faults.inject = {"slow:0:2", "fail:1@3"};
  const std::string dumped = dump_job_config(c);
  EXPECT_NE(dumped.find("train_file = \"a\\tb\\nc\\u0001d\\uFEFF\\\"q\\\"\\\\\"\n"), std::string::npos) << dumped;
  EXPECT_NE(dumped.find("inject = [\"slow:0:2\", \"fail:1@3\"]\n"), std::string::npos) << dumped;
  const job_config back = parse_job_config(dumped, "dump");
  EXPECT_EQ(back.data.train_file, c.data.train_file);
  EXPECT_EQ(dump_job_config(back), dumped);
}

}  // namespace
}  // namespace dpactor
