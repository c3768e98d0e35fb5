#pragma once
// The fixture of the tests that run the dpactor program as a user does
// (tests/cli_test.cpp, tests/nothing_lost_test.cpp).

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_support.hpp"

namespace dpactor::testing {

// A scratch directory with a valid tiny IDX dataset (8 features, 3 classes)
// and a config `job.cfg` that trains on it.
class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::uint8_t> pixels(40 * 8), labels(40);
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 13);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::uint8_t>(i % 3);
    write_text(dir / "images.idx", idx_bytes(0x08, {40, 8}, pixels));
    write_text(dir / "labels.idx", idx_bytes(0x08, {40}, labels));
    write_config("");
  }

  void write_config(const std::string& extra, const std::string& data = "") {
    const std::string images = (dir / "images.idx").string(), labels = (dir / "labels.idx").string();
    const std::string data_section = data.empty() ? "train_images = \"" + images + "\"\ntrain_labels = \"" + labels +
                                                        "\"\ntest_images = \"" + images + "\"\ntest_labels = \"" + labels + "\"\n"
                                                  : data;
    write_text(dir / "job.cfg", "[straggler]\npolicy = \"none\"\n[model]\nlayers = [8, 6, 3]\n[data]\n" +
                                             data_section + "[train]\nepochs = 2\nbatch_size = 8\n" + extra);
  }

  // Returns once `child` has written `record` to its metrics file (m.jsonl),
  // by default any step record; a child that ended first, or wrote none in
  // 120 s, fails the test.
  void wait_until_training(cli_process& child, const std::string& record = R"("event":"step")") {
    ASSERT_TRUE(eventually(
        [&] { return !child.running() || read_text(dir / "m.jsonl").find(record) != std::string::npos; },
        std::chrono::seconds(120)))
        << "no " << record << " within 120 s: " << child.output_so_far();
    ASSERT_TRUE(child.running()) << "the run ended before the signal: " << child.output_so_far();
  }

  // Runs dpactor and checks the exit code and a fragment of its output, and
  // that no checkpoint was left behind.
  void expect_failure(const std::vector<std::string>& args, int code, const std::string& fragment) {
    const process_result r = run_cli(args, dir.path());
    EXPECT_EQ(r.exit_code, code) << r.output;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << "expected \"" << fragment << "\" in:\n" << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "checkpoints")) << "a failed start left a checkpoint directory";
  }

  scratch_dir dir;
};

}  // namespace dpactor::testing
