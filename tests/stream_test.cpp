// Stream mode in-process (See Note [Exactly-once offsets]): fed records
// are trained once whatever cuts, faults, joins, idle waits and stops
// happen, by the devices' own reports (trained events, digests of sequence
// numbers); the committed offset follows the checkpoints; and a stopped,
// resumed and replayed stream gives the bytes of an uninterrupted one.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include <dpactor/engine.hpp>
#include "stream_records.hpp"
#include <dpactor/error.hpp>
#include "test_support.hpp"
#include "tensors/json.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::scratch_dir;
using testing::stream_digest;
using testing::stream_records;

job_config stream_job(std::int64_t replicas) {
  job_config c = testing::small_job(replicas, 32);
  c.train.mode = train_mode::stream;
  c.train.micro_batch = 8;
  c.train.record_trained = true;
  c.train.stream_queue = 256;
  c.train.log_every = 1;
  return c;
}

// What a run's devices trained and which checkpoints it wrote.
struct stream_record_book {
  std::mutex mutex;
  std::int64_t samples = 0;
  std::uint64_t digest = 0;
  std::map<std::int64_t, std::pair<std::int64_t, std::uint64_t>> by_step;  // step -> samples, digest
  std::vector<checkpoint_event> checkpoints;
  void on(const event& e) {
    std::lock_guard lock(mutex);
    if (const auto* t = std::get_if<trained_event>(&e)) {
      samples += t->samples;
      digest += t->digest;
      auto& s = by_step[t->step];
      s.first += t->samples;
      s.second += t->digest;
    } else if (const auto* c = std::get_if<checkpoint_event>(&e)) {
      checkpoints.push_back(*c);
    }
  }
  std::int64_t trained() {
    std::lock_guard lock(mutex);
    return samples;
  }
};

// Feeds records [from, end) in small pieces, as a service would.
void feed_all(Engine& engine, std::int64_t from, std::int64_t end, std::chrono::milliseconds pause = 0ms) {
  constexpr std::int64_t piece = 10;
  for (std::int64_t s = from; s < end; s += piece) {
    const auto records = stream_records(s, std::min(end, s + piece));
    std::span<const record> rest(records);
    while (!rest.empty()) {
      const feed_result r = engine.feed(rest, 5s);
      ASSERT_NE(r.status, feed_result::outcome::closed) << "at record " << rest.front().sequence;
      rest = rest.subspan(r.taken);
    }
    if (pause > 0ms) std::this_thread::sleep_for(pause);
  }
}

TEST(Stream, EveryFedRecordIsTrainedOnceAndTheOffsetFollowsTheCheckpoints) {
  scratch_dir dir;
  job_config c = stream_job(2);
  c.train.checkpoint_dir = (dir / "ckpt").string();
  c.train.checkpoint_every = 4;
  constexpr std::int64_t total = 32 * 25 + 7;  // the last step is partial
  stream_record_book book;
  Engine engine(c);
  engine.on_event([&](const event& e) { book.on(e); });
  engine.start();
  EXPECT_EQ(engine.committed_sequence(), -1);
  feed_all(engine, 0, total);
  engine.end_stream();
  const run_summary s = testing::wait_or_exit(engine, 120s, "stream run");
  EXPECT_EQ(s.steps, 26);
  EXPECT_EQ(book.samples, total);
  EXPECT_EQ(book.digest, stream_digest(total)) << "some record was trained twice, or never";
  ASSERT_GE(book.checkpoints.size(), 6u);
  std::int64_t last = -1;
  for (const auto& k : book.checkpoints) {
    EXPECT_GE(k.committed_sequence, last) << "the offset went back at step " << k.step;
    // In reproducible mode nothing is trained out of order: the offset is
    // that of the step's last record.
    if (k.step < 26) {
      EXPECT_EQ(k.committed_sequence, 32 * k.step - 1) << "step " << k.step;
    }
    last = k.committed_sequence;
  }
  EXPECT_EQ(last, total - 1);
  EXPECT_EQ(engine.committed_sequence(), total - 1);
  const json trainer = json::parse(testing::read_text(testing::latest_checkpoint(dir / "ckpt") / "trainer.json"));
  EXPECT_EQ(trainer.at("stream").at("committed_sequence").get<std::int64_t>(), total - 1);
}

TEST(Stream, AStoppedRunResumedAndReplayedEqualsAnUninterruptedOneByteForByte) {
  constexpr std::int64_t total = 32 * 20;
  scratch_dir dir;
  // A: one replica, the whole stream.
  {
    job_config c = stream_job(1);
    c.train.checkpoint_dir = (dir / "a").string();
    Engine engine(c);
    engine.start();
    feed_all(engine, 0, total);
    engine.end_stream();
    testing::wait_or_exit(engine, 120s, "uninterrupted run");
  }
  // B: two replicas stop part-way with records still queued ...
  stream_record_book first, second;
  std::int64_t committed = -1;
  {
    job_config c = stream_job(2);
    c.train.checkpoint_dir = (dir / "b").string();
    Engine engine(c);
    engine.on_event([&](const event& e) { first.on(e); });
    engine.start();
    feed_all(engine, 0, 300);
    ASSERT_TRUE(testing::eventually([&] { return first.trained() >= 160; }, 60s));
    engine.stop();
    testing::wait_or_exit(engine, 120s, "stopped run");
    committed = engine.committed_sequence();
  }
  ASSERT_GE(committed, 159);
  ASSERT_LT(committed, 299) << "the stop left no record untrained: the test proves less";
  EXPECT_EQ((committed + 1) % 32, 0) << "a stop formed a partial batch";
  // ... and three resume it, fed the whole stream again from the start.
  {
    job_config c = stream_job(3);
    c.train.checkpoint_dir = (dir / "b").string();
    Engine engine(c, testing::resume_from(dir / "b"));
    engine.on_event([&](const event& e) { second.on(e); });
    engine.start();
    EXPECT_EQ(engine.committed_sequence(), committed);
    feed_all(engine, 0, total);
    engine.end_stream();
    testing::wait_or_exit(engine, 120s, "resumed run");
    EXPECT_EQ(engine.committed_sequence(), total - 1);
  }
  // Each record once: the first run's steps inside its checkpoint, then the second's.
  std::int64_t samples = second.samples;
  std::uint64_t digest = second.digest;
  for (const auto& [step, sd] : first.by_step)
    if (step <= committed / 32) {
      samples += sd.first;
      digest += sd.second;
    }
  EXPECT_EQ(samples, total);
  EXPECT_EQ(digest, stream_digest(total));
  const auto final_of = [&](const std::string& run) {
    return testing::latest_checkpoint(dir / run) / "model.safetensors";
  };
  EXPECT_EQ(testing::tensor_bytes(final_of("a")), testing::tensor_bytes(final_of("b")))
      << "a replayed stream must give the bytes of an uninterrupted one";
}

TEST(Stream, AnIdleStreamWaitsForRecordsAndIsNotTakenForAHang) {
  job_config c = stream_job(2);
  c.cluster.hang_timeout_s = 0.3;
  c.cluster.first_step_timeout_s = 0.3;
  stream_record_book book;
  std::atomic<int> generations{0};
  Engine engine(c);
  engine.on_event([&](const event& e) {
    book.on(e);
    if (std::holds_alternative<membership_event>(e)) ++generations;
  });
  engine.start();
  feed_all(engine, 0, 64);
  std::this_thread::sleep_for(1200ms);  // four hang timeouts without a record
  feed_all(engine, 64, 128);
  engine.end_stream();
  const run_summary s = testing::wait_or_exit(engine, 60s, "idle stream");
  EXPECT_EQ(generations, 1) << "the idle wait was taken for a hang";
  EXPECT_EQ(s.membership_changes, 0);
  EXPECT_EQ(book.samples, 128);
  EXPECT_EQ(book.digest, stream_digest(128));
}

// Cuts (not reproducible: cut records go out again behind later ones), a
// failing device and a joining one, while records stream in.
TEST(Stream, CutsFaultsAndJoinsNeitherDropNorRepeatARecord) {
  job_config c = stream_job(2);
  c.train.reproducible = false;
  c.straggler.policy = straggler_policy::cut;
  c.faults.inject = {"jitter:1:1.0:30", "fail:0@12"};
  c.cluster.cpus = 3;
  c.train.checkpoint_every = 5;
  scratch_dir dir;
  c.train.checkpoint_dir = (dir / "ckpt").string();
  constexpr std::int64_t total = 32 * 30;
  stream_record_book book;
  Engine engine(c);
  engine.on_event([&](const event& e) { book.on(e); });
  engine.start();
  std::thread feeder([&] { feed_all(engine, 0, total, 5ms); });
  ASSERT_TRUE(testing::eventually([&] { return book.trained() >= 320; }, 60s));
  const std::string joined = engine.add_device(30s);
  feeder.join();
  engine.end_stream();
  const run_summary s = testing::wait_or_exit(engine, 120s, "stream with faults");
  EXPECT_FALSE(joined.empty());
  EXPECT_GT(s.cuts, 0) << "nothing was cut: the test proves less";
  EXPECT_GE(s.membership_changes, 2) << "the failure and the join";
  EXPECT_EQ(book.samples, total);
  EXPECT_EQ(book.digest, stream_digest(total));
  std::int64_t last = -1;
  for (const auto& k : book.checkpoints) {
    EXPECT_GE(k.committed_sequence, last);
    last = k.committed_sequence;
  }
  EXPECT_EQ(last, total - 1);
}

// A service asks for a checkpoint (POST /checkpoint) while the stream waits
// for records: it is written at once, with the offset of what is trained.
TEST(Stream, ACheckpointAskedForWhileIdleIsWrittenAtOnce) {
  scratch_dir dir;
  job_config c = stream_job(2);
  c.train.checkpoint_dir = (dir / "ckpt").string();
  stream_record_book book;
  Engine engine(c);
  engine.on_event([&](const event& e) { book.on(e); });
  engine.start();
  feed_all(engine, 0, 100);  // 3 steps and 4 records left waiting
  ASSERT_TRUE(testing::eventually([&] { return book.trained() == 96; }, 30s));
  engine.request_checkpoint();
  ASSERT_TRUE(testing::eventually([&] { return engine.committed_sequence() == 95; }, 30s))
      << "committed " << engine.committed_sequence();
  {
    std::lock_guard lock(book.mutex);
    ASSERT_EQ(book.checkpoints.size(), 1u);
    EXPECT_EQ(book.checkpoints[0].step, 3);
  }
  engine.stop();
  testing::wait_or_exit(engine, 60s, "stream with a checkpoint on demand");
  EXPECT_EQ(engine.committed_sequence(), 95) << "the 4 queued records stay for the replay";
}

// Serving while training: the first member publishes copies of its
// parameters; reading one asks nothing of the run. Copied after every step,
// the last copy is the final checkpoint's parameters, under its step.
TEST(Serving, TheLatestSnapshotIsTheNewestParametersUnderTheirStep) {
  scratch_dir dir;
  job_config c = stream_job(2);
  c.train.checkpoint_dir = (dir / "ckpt").string();
  c.service.snapshot_every_s = 1e-9;  // after every step
  Engine engine(c);
  EXPECT_EQ(engine.latest_snapshot(), nullptr);
  engine.start();
  std::atomic<bool> done{false};
  std::int64_t versions_seen = 0, last_version = -1;
  bool went_back = false;
  std::thread reader([&] {
    while (!done) {
      if (const auto snap = engine.latest_snapshot()) {
        if (snap->step < last_version) went_back = true;
        if (snap->step != last_version) ++versions_seen;
        last_version = snap->step;
      }
      std::this_thread::yield();
    }
  });
  feed_all(engine, 0, 32 * 40, 1ms);
  engine.end_stream();
  testing::wait_or_exit(engine, 60s, "serving run");
  done = true;
  reader.join();
  EXPECT_FALSE(went_back) << "a newer copy was replaced by an older one";
  EXPECT_GT(versions_seen, 2);
  const auto last = engine.latest_snapshot();
  ASSERT_NE(last, nullptr) << "the last copy stays after the run";
  EXPECT_EQ(last->step, 40);
  const auto stored = testing::tensor_bytes(testing::latest_checkpoint(dir / "ckpt") / "model.safetensors");
  for (const auto& [name, bytes] : stored) {
    const auto values = last->tensor(name);
    ASSERT_EQ(values.size_bytes(), bytes.size()) << name;
    EXPECT_EQ(std::memcmp(values.data(), bytes.data(), bytes.size()), 0) << name << " differs from the checkpoint";
  }
}

// Records trained before the stream paused are checkpointed, and their
// offset committed, checkpoint_every_s later, without waiting for more.
TEST(Stream, AnIdleStreamCheckpointsWhatItTrainedOnTime) {
  scratch_dir dir;
  job_config c = stream_job(2);
  c.train.checkpoint_dir = (dir / "ckpt").string();
  c.train.checkpoint_every_s = 0.3;
  stream_record_book book;
  Engine engine(c);
  engine.on_event([&](const event& e) { book.on(e); });
  engine.start();
  feed_all(engine, 0, 70);  // 2 steps, 6 records waiting
  ASSERT_TRUE(testing::eventually([&] { return book.trained() == 64; }, 30s));
  EXPECT_TRUE(testing::eventually([&] { return engine.committed_sequence() == 63; }, 5s))
      << "committed " << engine.committed_sequence() << ": the pause held the checkpoint back";
  const auto written = [&] {
    std::lock_guard lock(book.mutex);
    return book.checkpoints.size();
  };
  const std::size_t once = written();
  std::this_thread::sleep_for(1s);  // idle for three periods with nothing new trained
  EXPECT_EQ(written(), once) << "an idle stream with nothing new trained writes no more checkpoints";
  engine.stop();
  testing::wait_or_exit(engine, 60s, "idle checkpoints");
}

TEST(Stream, MisuseIsRefusedWithAClearError) {
  {
    Engine files(testing::small_job(1, 32));
    const auto one = stream_records(0, 1);
    EXPECT_THROW(files.feed(one), config_error);
  }
  {
    job_config c = stream_job(1);
    c.schedule.kind = schedule_kind::cosine;
    EXPECT_THROW(Engine{c}, config_error) << "a cosine schedule has no length in a stream";
  }
  {
    job_config c = stream_job(1);
    c.train.stream_queue = 16;
    EXPECT_THROW(Engine{c}, config_error) << "a queue smaller than a batch";
  }
  {
    Engine engine(stream_job(1));
    const auto one = stream_records(0, 1);
    EXPECT_EQ(engine.feed(one).status, feed_result::outcome::closed) << "no run in progress";
    engine.start();
    auto bad = stream_records(0, 2);
    bad[1].features.pop_back();
    EXPECT_THROW(engine.feed(bad), data_error);
    engine.stop();
    engine.wait();
  }
  {
    // A checkpoint of a file run cannot resume a stream, nor the reverse.
    scratch_dir dir;
    job_config files = testing::small_job(1, 32);
    files.train.checkpoint_dir = (dir / "ckpt").string();
    files.train.max_steps = 2;
    Engine first(files);
    first.start();
    first.wait();
    job_config c = stream_job(1);
    c.train.checkpoint_dir = (dir / "ckpt").string();
    Engine resumed(c, testing::resume_from(dir / "ckpt"));
    try {
      resumed.start();
      FAIL() << "a file run's checkpoint resumed a stream";
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("train.mode"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dpactor
