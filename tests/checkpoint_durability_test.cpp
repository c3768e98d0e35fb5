// The order in which a checkpoint reaches the disk, as a crash would find it.
//
// A power cut can keep any prefix of the writes that were not fsynced. A
// checkpoint directory is therefore complete on disk before its name appears:
// every file in it, and the directory itself, are fsynced before the rename
// from its temporary name; `latest` moves only after that, and the root is
// fsynced so that both renames survive. This program interposes fsync() and
// rename() (its own definitions win over libc's for every call in the
// process, libstdc++'s included), records them in order, and checks that
// order for write_checkpoint.

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "train/checkpoint.hpp"
#include "tests/test_support.hpp"

namespace {

struct journal_entry {
  std::string op;    // "fsync" or "rename"
  std::string path;  // the file synced, or the rename's source
  std::string to;    // the rename's target
};

std::mutex journal_mutex;
std::vector<journal_entry>* journal = nullptr;  // recording while set

std::string path_of_fd(int fd) {
  char target[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  return n < 0 ? std::string("?") : std::string(target, static_cast<std::size_t>(n));
}

std::string absolute(const char* path) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return p.string();
}

void record(journal_entry e) {
  std::lock_guard lock(journal_mutex);
  if (journal != nullptr) journal->push_back(std::move(e));
}

}  // namespace

// Set by a test: the next fsync() first sleeps this long (a slow disk).
std::atomic<int> next_fsync_delay_ms{0};

extern "C" int fsync(int fd) {
  static const auto real = reinterpret_cast<int (*)(int)>(::dlsym(RTLD_NEXT, "fsync"));
  if (const int ms = next_fsync_delay_ms.exchange(0); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  record({"fsync", path_of_fd(fd), ""});
  return real(fd);
}

extern "C" int rename(const char* from, const char* to) {
  static const auto real = reinterpret_cast<int (*)(const char*, const char*)>(::dlsym(RTLD_NEXT, "rename"));
  const std::string source = absolute(from);  // before the rename: the source exists
  const int result = real(from, to);
  record({"rename", source, absolute(to)});
  return result;
}

namespace dpactor {
namespace {

namespace fs = std::filesystem;

class CheckpointDurability : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = {{6, 5, 3}, activation::relu, loss_kind::cross_entropy};
    layout_ = make_state_layout(spec_, optimizer_config{});
    state_.assign(layout_.total_size(), 0.25f);
    write_step_counter(state_, layout_, 77);
    record_.step = 77;
    record_.train_samples = 100;
    root_ = fs::canonical(dir_.path()).string();
    std::lock_guard lock(journal_mutex);
    journal = &entries_;
  }
  void TearDown() override {
    std::lock_guard lock(journal_mutex);
    journal = nullptr;
  }
  std::vector<journal_entry> entries() {
    std::lock_guard lock(journal_mutex);
    return entries_;
  }
  // The position of the first entry that matches, if any.
  static std::optional<std::size_t> find(const std::vector<journal_entry>& j, const std::string& op,
                                         const std::string& path, const std::string& to = "") {
    for (std::size_t i = 0; i < j.size(); ++i)
      if (j[i].op == op && j[i].path == path && (to.empty() || j[i].to == to)) return i;
    return std::nullopt;
  }
  static std::optional<std::size_t> find_rename_to(const std::vector<journal_entry>& j, const std::string& to) {
    for (std::size_t i = 0; i < j.size(); ++i)
      if (j[i].op == "rename" && j[i].to == to) return i;
    return std::nullopt;
  }

  testing::scratch_dir dir_;
  mlp_spec spec_;
  state_layout layout_;
  std::vector<float> state_;
  trainer_record record_;
  std::string root_;
  std::vector<journal_entry> entries_;
};

TEST_F(CheckpointDurability, EveryFileAndTheDirectoryAreSyncedBeforeTheCheckpointIsNamed) {
  write_checkpoint(root_, layout_, state_, record_);
  const auto j = entries();
  ASSERT_TRUE(std::any_of(j.begin(), j.end(), [](const journal_entry& e) { return e.op == "fsync"; }))
      << "no fsync was seen: the interposition does not work, and this test would prove nothing";
  const std::string final_dir = root_ + "/step-00000077";
  const auto named = find_rename_to(j, final_dir);
  ASSERT_TRUE(named) << "the checkpoint directory was not renamed into place";
  const std::string tmp = j[*named].path;
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "trainer.json"}) {
    SCOPED_TRACE(file);
    ASSERT_TRUE(fs::exists(fs::path(final_dir) / file));
    const auto synced = find(j, "fsync", tmp + "/" + file);
    ASSERT_TRUE(synced) << "never fsynced";
    EXPECT_LT(*synced, *named) << "fsynced only after the directory was renamed";
  }
  const auto dir_synced = find(j, "fsync", tmp);
  ASSERT_TRUE(dir_synced) << "the directory's entries were never fsynced under its temporary name";
  EXPECT_LT(*dir_synced, *named);
}

TEST_F(CheckpointDurability, LatestMovesOnlyAfterTheCheckpointIsCompleteAndTheRootIsSyncedLast) {
  write_checkpoint(root_, layout_, state_, record_);
  const auto j = entries();
  const auto named = find_rename_to(j, root_ + "/step-00000077");
  const auto latest = find_rename_to(j, root_ + "/latest");
  ASSERT_TRUE(named && latest);
  EXPECT_LT(*named, *latest) << "`latest` named a checkpoint that was not in place yet";
  const auto latest_synced = find(j, "fsync", root_ + "/latest.tmp");
  ASSERT_TRUE(latest_synced) << "latest.tmp was never fsynced";
  EXPECT_LT(*latest_synced, *latest);
  std::optional<std::size_t> root_synced;
  for (std::size_t i = *latest; i < j.size(); ++i)
    if (j[i].op == "fsync" && j[i].path == root_) root_synced = i;
  EXPECT_TRUE(root_synced) << "the root was not fsynced after the renames: a crash could lose them";
}

// See Note [A failing run waits for its checkpoint writes]: a run that fails
// while a checkpoint it assembled is being written reports the failure only
// once the checkpoint is complete and `latest` names it, and tells of that
// checkpoint first (its event, which a service commits its upstream offsets
// on; the engine's teardown would finish the write, but tell no one). The write is held
// up by a slow fsync (1.5 s); the loader fails issuing step 7, after the
// checkpoint of step 4 went to the writer (a window of two one-step
// messages: step 7 is issued only once step 5 committed, and a step of this
// job takes well under a millisecond), and before any other checkpoint.
TEST(FailingRun, ReportsItsErrorOnlyOnceTheCheckpointBeingWrittenIsComplete) {
  testing::scratch_dir dir;
  job_config c = testing::small_job(1, 32, 1024);
  c.train.epochs = 100;
  c.train.checkpoint_dir = (dir / "ck").string();
  c.train.checkpoint_every = 4;
  c.train.steps_per_message = 1;  // a window of prefetch (2) steps
  c.faults.inject = {"crash:loader@7"};
  next_fsync_delay_ms = 1500;
  Engine engine(c);
  std::mutex m;
  std::vector<checkpoint_event> told;
  engine.on_event([&](const event& e) {
    if (const auto* k = std::get_if<checkpoint_event>(&e)) {
      const std::lock_guard lock(m);
      told.push_back(*k);
    }
  });
  engine.start();
  try {
    engine.wait();
    ADD_FAILURE() << "the run completed";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("the loader failed"), std::string::npos) << e.what();
    // Read before the engine ends: the error must not have come first.
    EXPECT_EQ(testing::read_text(dir / "ck" / "latest"), "step-00000004\n");
    EXPECT_TRUE(fs::exists(dir / "ck" / "step-00000004" / "model.safetensors"));
    const std::lock_guard lock(m);
    ASSERT_EQ(told.size(), 1u) << "the checkpoint written was not told";
    EXPECT_EQ(told[0].step, 4);
  }
  EXPECT_EQ(next_fsync_delay_ms.load(), 0) << "no checkpoint was written";
}

}  // namespace
}  // namespace dpactor
