// Config files as users give them (config/config_file.hpp): a pipe or a
// process substitution is read; a directory, a loop of links, a dangling
// link or an endless device is named as what it is; and every message shows
// the invisible characters of what the user typed (tensors/visible_text.hpp).

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "config/config_file.hpp"
#include <dpactor/error.hpp>
#include "tensors/visible_text.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;

std::string load_error(const fs::path& path, const std::vector<std::string>& sets = {}) {
  return testing::error_of<config_error>([&] { load_job_config(path, sets); });
}

TEST(ConfigFile, APipeIsReadAsAFileIs) {
  testing::scratch_dir dir;
  const fs::path fifo = dir / "job.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // The writer, as a shell's <(cat job.cfg) would be.
  std::thread writer([&] {
    std::ofstream out(fifo);
    out << "[train]\nepochs = 7\n";
  });
  const job_config c = load_job_config(fifo);
  writer.join();
  EXPECT_EQ(c.train.epochs, 7);
}

TEST(ConfigFile, WhatIsNotAConfigFileIsNamedAsWhatItIs) {
  testing::scratch_dir dir;
  fs::create_directory(dir / "configs");
  EXPECT_NE(load_error(dir / "configs").find("configs: a directory, not a config file"), std::string::npos);
  fs::create_symlink(dir / "b", dir / "a");
  fs::create_symlink(dir / "a", dir / "b");
  EXPECT_NE(load_error(dir / "a").find("a: a loop of symbolic links, not a config file"), std::string::npos);
  fs::create_symlink(dir / "gone.cfg", dir / "link.cfg");
  EXPECT_NE(load_error(dir / "link.cfg").find("link.cfg: a symbolic link to a file that does not exist"),
            std::string::npos);
  EXPECT_NE(load_error(dir / "missing.cfg").find("missing.cfg: config file not found"), std::string::npos);
  // An endless device is read up to a bound, then refused.
  EXPECT_NE(load_error("/dev/zero").find("/dev/zero: more than 16 MiB, not a config file"), std::string::npos);
}

TEST(ConfigFile, AByteOrderMarkBeforeTheTextIsAllowedAndInsideItIsShown) {
  testing::scratch_dir dir;
  testing::write_text(dir / "bom.cfg", "\xef\xbb\xbf[train]\nepochs = 3\n");
  EXPECT_EQ(load_job_config(dir / "bom.cfg").train.epochs, 3);
  testing::write_text(dir / "value.cfg", "[model]\nactivation = \"\xef\xbb\xbfrelu\"\n");
  const std::string msg = load_error(dir / "value.cfg");
  EXPECT_NE(msg.find("unknown value \"\\uFEFFrelu\""), std::string::npos) << msg;
}

TEST(ConfigFile, AControlCharacterInAKeyOrAFileNameIsShownEscaped) {
  testing::scratch_dir dir;
  testing::write_text(dir / "tab.cfg", "[train]\n\"ep\\u0001ochs\" = 3\n");  // a TOML escape in a quoted key
  const std::string key = load_error(dir / "tab.cfg");
  EXPECT_NE(key.find("train.ep\\x01ochs: unknown key"), std::string::npos) << key;
  const std::string name = load_error(dir / "new\nline.cfg");
  EXPECT_NE(name.find("new\\nline.cfg: config file not found"), std::string::npos) << name;
}

TEST(ConfigFile, ASetErrorNamesTheSetArgument) {
  const std::string section = testing::error_of<config_error>([] { parse_job_config("", "job.cfg", {"nosuchsection.key=1"}); });
  EXPECT_EQ(section.find("--set nosuchsection.key=1: unknown section [nosuchsection]; sections are model, data"), 0u)
      << section;
  EXPECT_EQ(section.find("<config>"), std::string::npos) << section;
  const std::string key = testing::error_of<config_error>([] { parse_job_config("", "job.cfg", {"train.epoch=1"}); });
  EXPECT_EQ(key.find("--set train.epoch=1: train.epoch: unknown key (did you mean 'train.epochs'?)"), 0u) << key;
}

TEST(VisibleText, InvisibleAndControlCharactersAreEscapedAndTheRestIsKept) {
  EXPECT_EQ(visible("plain \xc3\xa9t\xc3\xa9 \\ path/x"), "plain \xc3\xa9t\xc3\xa9 \\ path/x");
  EXPECT_EQ(visible("a\tb\nc\rd\x01\x7f"), "a\\tb\\nc\\rd\\x01\\x7f");
  EXPECT_EQ(visible("\xef\xbb\xbfx"), "\\uFEFFx");
  EXPECT_EQ(visible("zero\xe2\x80\x8bwidth"), "zero\\u200Bwidth");
  EXPECT_EQ(visible("rtl\xe2\x80\xaeoverride"), "rtl\\u202Eoverride");
  EXPECT_EQ(visible("not utf-8 \xc5 \xff"), "not utf-8 \\xc5 \\xff");
  EXPECT_EQ(visible("overlong \xc0\xaf"), "overlong \\xc0\\xaf");
  EXPECT_EQ(visible(visible("a\tb\xef\xbb\xbf\xff")), visible("a\tb\xef\xbb\xbf\xff")) << "its own visible()";
}

}  // namespace
}  // namespace dpactor
