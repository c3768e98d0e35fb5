// Bytes sent (See Note [Bytes sent]): each collective call of a counted
// endpoint adds what this test computes from the buffers' sizes and the
// backend's chunks; and a whole run's summary equals the count this test makes
// from the model's state layout and the number of steps or rounds, not
// another figure of the engine.

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include <dpactor/engine.hpp>
#include "comms/counted_collective.hpp"
#include "comms/local.hpp"
#include "tensors/replica.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

// Runs f(rank, endpoint) on `ranks` threads, each endpoint counted in its own counter.
template <class F>
std::vector<std::uint64_t> counted_run(int ranks, F f) {
  auto group = make_local_group(ranks);
  std::vector<bytes_counter> counters(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      counted_collective c(group->endpoint(r), counters[static_cast<std::size_t>(r)]);
      f(r, c);
    });
  for (auto& t : threads) t.join();
  std::vector<std::uint64_t> sent;
  for (const auto& c : counters) sent.push_back(c.sent.load());
  return sent;
}

TEST(BytesSent, EachCallCountsWhatLeavesTheRankInAReduceScatterAndAllGather) {
  for (const int ranks : {1, 2, 3}) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, " + std::to_string(n) + " floats");
      const auto group = make_local_group(ranks);
      const auto probe = group->endpoint(0);
      const auto own = [&](int r) {
        const auto [b, e] = probe->chunk(n, r);
        return static_cast<std::uint64_t>(e - b);
      };
      const auto m = static_cast<std::uint64_t>(ranks - 1);
      const auto all_reduce = counted_run(ranks, [&](int, collective& c) {
        std::vector<float> v(n, 1.0f);
        c.all_reduce_sum(v, {});
      });
      const auto scatter = counted_run(ranks, [&](int, collective& c) {
        std::vector<float> v(n, 1.0f);
        c.reduce_scatter_sum(v, {});
      });
      const auto gather = counted_run(ranks, [&](int, collective& c) {
        std::vector<float> a(n), b(n);
        const std::span<float> parts[2] = {a, b};
        c.all_gather(parts, {});
      });
      const auto broadcast = counted_run(ranks, [&](int, collective& c) {
        std::vector<float> v(n);
        c.broadcast(v, ranks - 1, {});
      });
      for (int r = 0; r < ranks; ++r) {
        const auto i = static_cast<std::size_t>(r);
        EXPECT_EQ(scatter[i], 4 * (n - own(r)));
        EXPECT_EQ(gather[i], 2 * 4 * own(r) * m);
        EXPECT_EQ(all_reduce[i], 4 * (n - own(r)) + 4 * own(r) * m);
        EXPECT_EQ(broadcast[i], r == ranks - 1 ? 4 * n * m : 0) << "only the root sends";
      }
    }
  }
}

// The small job on 2 members in diloco rounds of `every` inner steps over
// `workers` logical workers, with `codec` and `fragments`.
job_config diloco_job(std::int64_t workers, std::int64_t every, sync_codec codec = sync_codec::fp32,
                      std::int64_t fragments = 1) {
  job_config c = testing::small_job(2, 64, 1024);
  c.sync.mode = sync_mode::diloco;
  c.sync.workers = workers;
  c.sync.every = every;
  c.sync.codec = codec;
  c.sync.fragments = fragments;
  return c;
}

run_summary run_to_end(const job_config& c) {
  Engine engine(c);
  engine.start();
  return engine.wait();
}

// The replicas' layout in diloco: the parameters and the outer momentum.
state_layout outer_layout(const job_config& c) {
  optimizer_config outer;
  outer.nesterov = true;
  outer.momentum = 0.9;
  return make_state_layout(c.model, outer);
}

// A run's total: `exchanges` calls of `per_exchange` floats summed over the
// members, plus the first generation's broadcast of the state.
TEST(BytesSent, ARunsSummaryIsTheSumOfItsExchangesAndTheFirstBroadcast) {
  // 2 members, each step's header of 5 + 3 x 2 floats (train/step_runner.hpp)
  // all-reduced: over both members, 4 (h - c0 + c1 + h - c1 + c0) = 8h bytes.
  const std::uint64_t header = 5 + 3 * 2;
  {
    SCOPED_TRACE("every_step: the tree's reduce-scatter of the gradients, then the state's all-gather");
    job_config c = testing::small_job(2, 64, 512);  // 8 steps; two slices a step, one each
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 8);
    const state_layout layout = make_state_layout(c.model, c.optimizer);
    const std::uint64_t p = layout.parameter_size;
    // Reduce-scatter: each member sends the other's chunk of its node (p over
    // both); all-gather: each its chunk of the parameters and of the
    // momentum (2p over both).
    const std::uint64_t per_step = 8 * header + 4 * p + 4 * 2 * p;
    const std::uint64_t broadcast = 4 * layout.total_size();
    EXPECT_EQ(static_cast<std::uint64_t>(s.bytes_sent), 8 * per_step + broadcast);
  }
  for (const bool reproducible : {true, false}) {
    SCOPED_TRACE(std::string("every_step, bf16 (Note [Bf16 steps]), ") +
                 (reproducible ? "reproducible: a slice a member" : "fast: a member's gradient one leaf") +
                 ": each leaf's chunk and the sum's in two bytes a value, and no state gathered");
    job_config c = testing::small_job(2, 64, 512);  // 8 steps; two slices a step, one each
    c.sync.codec = sync_codec::bf16;
    c.train.reproducible = reproducible;
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 8);
    const state_layout layout = make_state_layout(c.model, c.optimizer);
    const std::uint64_t p = layout.parameter_size;
    const std::uint64_t per_step = 8 * header + 2 * p + 2 * p;
    EXPECT_EQ(static_cast<std::uint64_t>(s.bytes_sent), 8 * per_step + 4 * layout.total_size());
  }
  {
    SCOPED_TRACE("diloco: the pseudo-gradients' tree reduce-scatter, then their all-gather");
    const job_config c = diloco_job(4, 4);  // 4 rounds of 256 samples
    const run_summary s = run_to_end(c);
    ASSERT_EQ(s.steps, 4);
    const state_layout layout = outer_layout(c);
    const std::uint64_t p = layout.parameter_size;
    const std::uint64_t per_round = 8 * header + 4 * p + 4 * p;  // the gradient is gathered, not the state
    EXPECT_EQ(static_cast<std::uint64_t>(s.bytes_sent), 4 * per_round + 4 * layout.total_size());
    // The largest call: one member's chunk of the pseudo-gradient, sent or
    // gathered (the chunks are the backend's).
    const auto probe = make_local_group(2)->endpoint(0);
    std::uint64_t largest = 0;
    for (int r = 0; r < 2; ++r) {
      const auto [b, e] = probe->chunk(p, r);
      largest = std::max<std::uint64_t>({largest, e - b, p - (e - b)});
    }
    EXPECT_EQ(static_cast<std::uint64_t>(s.largest_send), 4 * largest);
  }
  {
    SCOPED_TRACE("diloco, int8: the workers' block maxima, then one byte a value both ways");
    const job_config c = diloco_job(4, 4, sync_codec::int8);
    const run_summary s = run_to_end(c);
    ASSERT_EQ(s.steps, 4);
    const state_layout layout = outer_layout(c);
    const std::uint64_t p = layout.parameter_size;
    const std::uint64_t blocks = (p + 4095) / 4096;  // a scale per 4,096 values (Note [Int8 pseudo-gradients])
    // The maxima: 4 workers x blocks floats all-reduced (8 bytes a float over
    // both members); the int8 all-reduce: p - c0 + c0 + p - c1 + c1 = 2p.
    const std::uint64_t per_round = 8 * header + 8 * 4 * blocks + 2 * p;
    EXPECT_EQ(static_cast<std::uint64_t>(s.bytes_sent), 4 * per_round + 4 * layout.total_size());
  }
  {
    SCOPED_TRACE("diloco, bf16, a worker a member: each leaf's chunk and the sum's in two bytes a value");
    const job_config c = diloco_job(2, 4, sync_codec::bf16);
    const run_summary s = run_to_end(c);
    ASSERT_EQ(s.steps, 4);
    const state_layout layout = outer_layout(c);
    const std::uint64_t p = layout.parameter_size;
    // Reduce-scatter: each member sends the other's chunk of its leaf (p
    // values over both); all-gather: each its chunk of the sum (p over both).
    const std::uint64_t per_round = 8 * header + 2 * p + 2 * p;
    EXPECT_EQ(static_cast<std::uint64_t>(s.bytes_sent), 4 * per_round + 4 * layout.total_size());
  }
  {
    SCOPED_TRACE("diloco, 2 fragments: each step a half of the parameters");
    const job_config c = diloco_job(4, 4, sync_codec::fp32, 2);  // 8 steps of 2 inner steps, 128 samples
    const run_summary s = run_to_end(c);
    ASSERT_EQ(s.steps, 8);
    const state_layout layout = outer_layout(c);
    const std::uint64_t p = layout.parameter_size;
    const std::uint64_t halves[2] = {p / 2, p - p / 2};  // fragment f: [f p / 2, (f + 1) p / 2)
    std::uint64_t total = 4 * layout.total_size(), largest = 0;
    const auto probe = make_local_group(2)->endpoint(0);
    for (int step = 0; step < 8; ++step) {
      const std::uint64_t q = halves[step % 2];
      total += 8 * header + 4 * q + 4 * q;
      for (int r = 0; r < 2; ++r) {
        const auto [b, e] = probe->chunk(q, r);
        largest = std::max<std::uint64_t>({largest, e - b, q - (e - b)});
      }
    }
    EXPECT_EQ(static_cast<std::uint64_t>(s.bytes_sent), total);
    EXPECT_EQ(static_cast<std::uint64_t>(s.largest_send), 4 * largest) << "a call sends a half of plain diloco's";
  }
}

}  // namespace
}  // namespace dpactor
