// The round modes (sync.mode = "local_sgd" and "diloco"): their arithmetic
// without actors, the logical workers' store, and the engine against a plain
// loop written here from the algorithm's definition (DiLoCo, arXiv
// 2311.08105, Algorithm 1): K copies of the model, H inner steps each on the
// share of the data Note [Round data] defines, the pseudo-gradients
// n_k (global - inner_k) added in the summation tree's order, then the outer
// optimizer on the global weights. No engine code beyond the MLP kernel and
// the optimizer formulas; the engine must match it bitwise.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "config/config_file.hpp"
#include "data/loading.hpp"
#include "data/sampler.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/gemm.hpp"
#include "tensors/mlp.hpp"
#include "tensors/optimizer.hpp"
#include "tensors/safetensors.hpp"
#include "tests/recorded_run.hpp"
#include "tests/test_support.hpp"
#include "train/logical_workers.hpp"
#include "train/round_history.hpp"
#include "train/round_shape.hpp"

namespace dpactor {
namespace {

TEST(RoundShape, ARoundTrainsHGlobalBatchesSplitOverTheWorkers) {
  const round_shape s{16, 4, 128, 60000};
  EXPECT_EQ(s.round_samples(), 2048);
  EXPECT_EQ(s.worker_batch(), 32);
  EXPECT_EQ(s.rounds_per_epoch(), 30);  // 29 full rounds and 608 samples
  EXPECT_EQ(s.round_rows(0), 2048);
  EXPECT_EQ(s.round_rows(29), 60000 - 29 * 2048);
  EXPECT_EQ(s.share_rows(2048), 512);
  EXPECT_EQ(s.inner_steps(512), 16);
  EXPECT_EQ(s.share_rows(608), 152);
  EXPECT_EQ(s.inner_steps(152), 5);  // 4 x 32 and one of 24
  EXPECT_EQ(s.inner_steps_per_epoch(), 29 * 16 + 5);
  EXPECT_EQ(s.first_inner_position(0, 0), 0.0);
  EXPECT_EQ(s.first_inner_position(29, 0), 29.0 * 16);
  EXPECT_EQ(s.first_inner_position(30, 1), 29.0 * 16 + 5);
  EXPECT_EQ(s.first_inner_position(31, 1), 29.0 * 16 + 5 + 16);
}

TEST(RoundShape, AShortLastRoundMayLeaveWorkersWithoutData) {
  const round_shape s{4, 8, 64, 256 + 10};  // 10 samples in the last round, 8 workers
  EXPECT_EQ(s.rounds_per_epoch(), 2);
  EXPECT_EQ(s.share_rows(10), 2);  // 5 shares of 2: workers 5 to 7 train nothing
  EXPECT_EQ(s.inner_steps_per_epoch(), 4 + 1);
}

TEST(LogicalWorkerStore, ARoundReadsTheStateItsWorkerWroteForTheRoundBefore) {
  logical_worker_store store(2, {0.0f, 0.0f});
  EXPECT_EQ(store.read(0, 0), (std::vector<float>{0.0f, 0.0f}));
  store.write(0, 0, {1.0f, 0.0f});
  store.write(0, 1, {2.0f, 0.0f});
  EXPECT_EQ(store.read(0, 1), (std::vector<float>{1.0f, 0.0f})) << "a round run again reads the same state";
  EXPECT_EQ(store.read(0, 2), (std::vector<float>{2.0f, 0.0f}));
  EXPECT_EQ(store.read(1, 2), (std::vector<float>{0.0f, 0.0f})) << "the other worker is untouched";
  store.write(0, 1, {3.0f, 0.0f});  // round 1 run again: replaces it
  EXPECT_EQ(store.read(0, 2), (std::vector<float>{3.0f, 0.0f}));
  // A device of an ended generation finishing round 0 late leaves round 1.
  store.write(0, 0, {1.0f, 0.0f});
  EXPECT_EQ(store.read(0, 5), (std::vector<float>{3.0f, 0.0f}));
  for (std::int64_t r = 1; r <= 8; ++r) store.write(0, r, {static_cast<float>(r), 0.0f});
  EXPECT_EQ(store.read(0, 7), (std::vector<float>{6.0f, 0.0f}));
  EXPECT_THROW(store.read(0, 2), std::logic_error) << "a state no longer kept is an error, not the initial state";
}

// See Note [Overlapped delayed rounds]: a round waits for its worker's round
// before it, told once that it waits (the device marks itself as in the
// collective: marking at every poll would hide a hung member from the hang
// detection), and gives up when the generation ends.
TEST(LogicalWorkerStore, ARoundWaitsForItsWorkersRoundBeforeToldOnceAndStopsWhenTold) {
  logical_worker_store store(1, {0.0f});
  int waited = 0, polls = 0;
  const auto read = [&](std::int64_t round, int stop_after) {
    polls = 0;
    return store.read_when_written(0, round, [&] { return ++polls > stop_after; }, [&] { ++waited; });
  };
  EXPECT_EQ(read(0, 0), (std::vector<float>{0.0f})) << "the first round waits for nothing";
  EXPECT_EQ(waited, 0);
  EXPECT_EQ(read(2, 5), std::nullopt) << "round 1 is not written";
  EXPECT_EQ(polls, 6);
  EXPECT_EQ(waited, 1) << "told once, not at every poll";
  store.write(0, 1, {1.0f});
  EXPECT_EQ(read(2, 5), (std::vector<float>{1.0f}));
  EXPECT_EQ(waited, 1);
}

TEST(LogicalWorkerStore, AProcessReadsOnlyTheWorkersItHolds) {
  // Across processes a store holds its node's workers (See Note [Worker
  // placement]): another's state is an error, not the first round's state.
  logical_worker_store store(3, {0.0f});
  store.write(0, 0, {1.0f});
  store.write(2, 0, {2.0f});
  EXPECT_TRUE(store.holds(1));
  const std::vector<std::size_t> mine{0, 1};
  store.hold_only(mine);
  EXPECT_TRUE(store.holds(0));
  EXPECT_FALSE(store.holds(2));
  EXPECT_EQ(store.read(0, 1), (std::vector<float>{1.0f}));
  EXPECT_EQ(store.read(1, 1), (std::vector<float>{0.0f})) << "a held worker that has not run starts from the first state";
  EXPECT_THROW(store.read(2, 0), std::logic_error);
  EXPECT_THROW(store.read(2, 1), std::logic_error);
}

// See Note [Moving logical workers]: a moved worker's state is installed
// by each member of its new node, and the second install never erases a
// round the first member's device has run since.
TEST(LogicalWorkerStore, AMovedWorkerIsInstalledOnceAndNeverOverANewerRound) {
  logical_worker_store store(2, {0.0f});
  const std::vector<std::size_t> mine{0};
  store.hold_only(mine);
  EXPECT_THROW(store.read(1, 5), std::logic_error);
  store.install(1, 5, {4.0f});  // the state after round 4
  EXPECT_TRUE(store.holds(1));
  EXPECT_EQ(store.read(1, 5), (std::vector<float>{4.0f}));
  EXPECT_THROW(store.read(1, 3), std::logic_error) << "nothing before the moved state";
  store.write(1, 5, {5.0f});
  store.install(1, 5, {4.0f});  // the node's second member
  EXPECT_EQ(store.read(1, 6), (std::vector<float>{5.0f})) << "the round run since stays";
  EXPECT_EQ(store.read(1, 5), (std::vector<float>{4.0f}));
  store.install_first(0);  // See Note [Replaying a lost worker's rounds]: no backup
  EXPECT_EQ(store.read(0, 0), (std::vector<float>{0.0f}));
}

// See Note [Fast rounds across processes]: a lost worker restarts from its
// backup without what the global parameters already hold: no residual, no
// progress, and with fragments its own parameters are the global ones and
// no samples since an exchange; its optimizer's slots and step counter stay.
TEST(LogicalWorkerRunner, ARestartedWorkerKeepsItsSlotsAndDropsWhatTheGlobalParametersHold) {
  const mlp_spec spec{{3, 2}};
  for (const bool fragments : {false, true}) {
    auto setup = std::make_shared<round_setup>();
    setup->codec = sync_codec::int8;
    setup->fragments = fragments ? 2 : 1;
    setup->delayed = !fragments;
    auto inner = std::make_unique<cpu_replica>(spec, optimizer_config{}, 4);
    const worker_state_shape shape = setup->state_shape(inner->layout());
    setup->parameters = shape.parameters;
    setup->store = std::make_shared<logical_worker_store>(2, std::vector<float>(shape.size(), 0.0f));
    logical_worker_runner runner(std::move(inner), setup);
    const std::size_t p = shape.parameters;
    const std::vector<float> global(p, 2.0f);
    runner.restart(1, 7, std::vector<float>(shape.size(), 1.0f), global);
    const std::vector<float> state = setup->store->read(1, 7);
    ASSERT_EQ(state.size(), shape.size());
    const auto at = [&](std::size_t i) { return state.begin() + static_cast<std::ptrdiff_t>(i); };
    EXPECT_TRUE(std::all_of(state.begin(), at(shape.kept), [](float x) { return x == 1.0f; })) << "the slots and tail";
    EXPECT_TRUE(std::all_of(at(shape.residual_at()), at(shape.residual_at() + p), [](float x) { return x == 0.0f; }))
        << "the residual";
    if (fragments) {
      EXPECT_TRUE(std::all_of(at(shape.parameters_at()), at(shape.parameters_at() + p), [](float x) { return x == 2.0f; }))
          << "its own parameters";
      EXPECT_TRUE(std::all_of(at(shape.samples_at()), state.end(), [](float x) { return x == 0.0f; })) << "the samples";
    } else {
      EXPECT_TRUE(std::all_of(at(shape.progress_at()), at(shape.progress_at() + p), [](float x) { return x == 0.0f; }))
          << "the progress";
    }
  }
}

// See Note [Replaying a lost worker's rounds]: the history keeps each
// round's first start and maxima, the rounds since the checkpoint asked for
// before the last (the last may not complete), and no more than its bytes,
// oldest first; it keeps nothing until told how much.
TEST(RoundHistory, KeepsTheRoundsSinceTheCheckpointBeforeTheLastWithinItsBytes) {
  round_history history;
  const std::vector<float> a{1.0f, 2.0f}, b{3.0f, 4.0f};
  history.record_start(0, a);
  EXPECT_EQ(history.start(0), std::nullopt) << "one process keeps nothing";
  history.keep(1 << 20);
  for (std::int64_t r = 0; r < 10; ++r) history.record_start(r, a);
  history.record_start(3, b);
  EXPECT_EQ(history.start(3), a) << "a round run again starts from the same bytes: the first is kept";
  history.record_maxima(3, b);
  EXPECT_EQ(history.maxima(3), b);
  EXPECT_EQ(history.maxima(4), std::nullopt);
  history.checkpoint_asked(4);
  EXPECT_EQ(history.start(0), a) << "checkpoint 4 may not complete: the backups are the first round's";
  history.checkpoint_asked(7);
  EXPECT_EQ(history.start(4), std::nullopt);
  EXPECT_EQ(history.maxima(3), std::nullopt);
  EXPECT_EQ(history.start(5), a) << "checkpoint 7 may not complete: the backups are 4's";
  EXPECT_EQ(history.bytes(), 5 * 2 * sizeof(float));
  history.keep(3 * 2 * sizeof(float));
  EXPECT_EQ(history.start(6), std::nullopt) << "past its bytes, the oldest go";
  EXPECT_EQ(history.start(7), a);
  EXPECT_EQ(history.start(9), a);
}

// The plain loop: `rounds` rounds of K workers, H inner steps each.
struct reference_run {
  std::vector<float> global, outer_slot;
  std::vector<float> held;  // sync.delay: the reduced update not applied yet
  std::vector<std::vector<float>> progress;  // sync.delay: each worker's progress not in `global` yet
};

// Note [Int8 pseudo-gradients], written out: the workers' values with
// their residuals, quantized with the scales of all of them, summed as
// integers, decoded; the residuals keep what was dropped.
std::vector<float> int8_exchange(std::vector<std::vector<float>>& values, std::vector<std::vector<float>>& residuals) {
  const std::size_t K = values.size(), n = values[0].size(), block = 4096;
  std::vector<float> sum(n, 0.0f);
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t end = std::min(n, begin + block);
    std::vector<float> m(K, 0.0f);
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t i = begin; i < end; ++i) {
        values[k][i] += residuals[k][i];
        m[k] = std::max(m[k], std::fabs(values[k][i]));
      }
    float total = 0.0f;
    for (std::size_t k = 0; k < K; ++k) total += m[k];
    const float scale = total / 127.0f;
    std::vector<int> limit(K, 0);
    int limits = 0;
    for (std::size_t k = 0; k < K && total > 0.0f; ++k)
      limits += limit[k] = static_cast<int>(std::floor(127.0 * static_cast<double>(m[k]) / static_cast<double>(total)));
    for (std::size_t k = K; limits > 127 && k-- > 0;)
      for (; limits > 127 && limit[k] > 0; --limits) --limit[k];
    for (std::size_t i = begin; i < end; ++i) {
      int q_sum = 0;
      for (std::size_t k = 0; k < K; ++k) {
        const float q = total > 0.0f ? std::clamp(std::nearbyint(values[k][i] / scale), static_cast<float>(-limit[k]),
                                                  static_cast<float>(limit[k]))
                                     : 0.0f;
        residuals[k][i] = values[k][i] - scale * q;
        q_sum += static_cast<int>(q);
      }
      EXPECT_LE(std::abs(q_sum), 127);
      sum[i] = scale * static_cast<float>(q_sum);
    }
  }
  return sum;
}

// Note [Bf16 pseudo-gradients], written out: each worker's value with its
// residual rounded to bf16 (to nearest, ties to even), the rounded values
// added as the tree's leaves, the sum rounded to bf16 again.
float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

std::vector<float> bf16_exchange(std::vector<std::vector<float>>& values, std::vector<std::vector<float>>& residuals,
                                 std::size_t begin, std::size_t end) {
  std::vector<float> sum(values[0].size(), 0.0f);
  for (std::size_t i = begin; i < end; ++i) {
    float leaf[4];
    for (std::size_t k = 0; k < 4; ++k) {
      const float v = values[k][i] + residuals[k][i];
      leaf[k] = round_bf16(v);
      residuals[k][i] = v - leaf[k];
    }
    sum[i] = round_bf16((leaf[0] + leaf[1]) + (leaf[2] + leaf[3]));
  }
  return sum;
}

// Note [Delayed rounds], written out (sync.delay = 1): each worker starts
// from the global weights plus its progress, and each round's outer step
// applies the previous round's reduced update; the run's last step
// (`last_step`, default the last of `rounds`) applies both.
reference_run reference_rounds(const job_config& c, int rounds, double outer_lr, double outer_momentum, bool nesterov,
                               int last_step = -1) {
  if (last_step < 0) last_step = rounds - 1;
  const bool delayed = c.sync.delay > 0;
  const bool int8 = c.sync.codec == sync_codec::int8;
  const bool bf16 = c.sync.codec == sync_codec::bf16;
  set_blas_threads(1);
  const train_test_data data = load_data(c.data, c.model.inputs(), c.model.outputs());
  const auto K = static_cast<std::size_t>(c.sync.workers), H = static_cast<std::size_t>(c.sync.every);
  const auto B = static_cast<std::size_t>(c.train.batch_size), b = B / K;
  mlp model(c.model, b);
  const std::size_t n = model.layout().size();
  reference_run run{std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f),
                    std::vector<std::vector<float>>(K, std::vector<float>(n, 0.0f))};
  std::vector<std::vector<float>>& progress = run.progress;
  init_mlp_parameters(c.model, run.global, static_cast<std::uint64_t>(c.train.seed));
  std::vector<std::vector<float>> inner_slot(K, std::vector<float>(n, 0.0f));
  std::vector<std::int64_t> inner_steps(K, 0);
  std::vector<std::vector<float>> residuals(K, std::vector<float>(n, 0.0f));
  const std::size_t rows_total = data.train->rows;
  optimizer_config outer;
  outer.kind = optimizer_kind::sgd;
  outer.lr = outer_lr;
  outer.momentum = outer_momentum;
  outer.nesterov = nesterov;
  outer.weight_decay = 0.0;
  lr_schedule schedule = make_lr_schedule(c, 1000);
  schedule.base_lr = c.optimizer.lr * static_cast<double>(b) / static_cast<double>(B);  // sync.scale_inner_lr
  std::vector<float> x(b * static_cast<std::size_t>(c.model.inputs())), grads(n);
  std::vector<std::int32_t> y(b);
  // Streaming (Note [Fragments]): a step is H / P inner steps, step r
  // exchanges fragment r mod P, and each worker keeps its own parameters,
  // taking the fragment exchanged last step from the global ones.
  const auto P = static_cast<std::size_t>(c.sync.fragments);
  const std::size_t h = H / P;
  const auto fragment = [&](std::size_t f) { return std::pair{f * n / P, (f + 1) * n / P}; };
  std::vector<std::vector<float>> own(K, run.global);
  std::vector<std::vector<float>> since(K, std::vector<float>(P, 0.0f));  // samples since each fragment's exchange
  // Note [Round data], written out: a step trains the next h x B samples of
  // the epoch's order (fewer at its end), worker k the k-th run of
  // ceil(n / K) of them, in inner batches of b.
  const std::size_t step_samples = h * B, per_epoch = (rows_total + step_samples - 1) / step_samples;
  const std::size_t last_share = (rows_total - (per_epoch - 1) * step_samples + K - 1) / K;
  const std::size_t inner_per_epoch = (per_epoch - 1) * h + (last_share + b - 1) / b;
  std::vector<std::uint32_t> order;
  for (int r = 0; r < rounds; ++r) {
    const std::size_t epoch = static_cast<std::size_t>(r) / per_epoch, within = static_cast<std::size_t>(r) % per_epoch;
    if (within == 0)
      order = epoch_order(rows_total, static_cast<std::uint64_t>(c.train.seed), static_cast<std::int64_t>(epoch),
                          c.train.shuffle);
    const std::size_t start = within * step_samples, n_step = std::min(step_samples, rows_total - start);
    const std::size_t share = (n_step + K - 1) / K;
    std::vector<std::vector<float>> pseudo(K, std::vector<float>(n, 0.0f));
    const auto [fb, fe] = fragment(static_cast<std::size_t>(r) % P);
    const auto [lb, le] = fragment((static_cast<std::size_t>(r) + P - 1) % P);
    float weights = 0.0f;
    for (std::size_t k = 0; k < K; ++k) {
      std::vector<float> w = own[k];
      std::copy(run.global.begin() + static_cast<std::ptrdiff_t>(lb), run.global.begin() + static_cast<std::ptrdiff_t>(le),
                w.begin() + static_cast<std::ptrdiff_t>(lb));
      if (delayed)
        for (std::size_t i = 0; i < n; ++i) w[i] = run.global[i] + progress[k][i];
      const std::vector<float> started = w;
      const std::size_t first = std::min(n_step, k * share), mine = std::min(n_step, first + share) - first;
      for (std::size_t j = 0; j * b < mine; ++j) {
        const std::size_t len = std::min(b, mine - j * b);
        const std::span<const std::uint32_t> rows(order.data() + start + first + j * b, len);
        const batch_ref batch = data.train->batch(rows);
        for (std::size_t i = 0; i < len; ++i) {
          std::copy_n(batch.features + rows[i] * batch.feature_count, batch.feature_count, x.data() + i * batch.feature_count);
          y[i] = batch.labels[rows[i]];
        }
        model.forward_backward(w.data(), grads.data(), x.data(), y.data(), len, /*overwrite=*/true);
        const std::span<float> slots[1] = {inner_slot[k]};
        optimizer_step(c.optimizer, w, grads, slots, static_cast<float>(1.0 / static_cast<double>(len)),
                       schedule.at(static_cast<double>(epoch * inner_per_epoch + within * h + j)), inner_steps[k]++);
      }
      for (float& x : since[k]) x += static_cast<float>(mine);
      const float samples = since[k][static_cast<std::size_t>(r) % P];
      since[k][static_cast<std::size_t>(r) % P] = 0.0f;
      weights += samples;
      for (std::size_t i = fb; i < fe; ++i) pseudo[k][i] = samples * ((delayed ? started[i] : run.global[i]) - w[i]);
      for (std::size_t i = 0; delayed && i < n; ++i) progress[k][i] = r == last_step ? 0.0f : w[i] - started[i];
      own[k] = w;
    }
    // The summation tree over 4 workers: (0 + 1) + (2 + 3); or the codec's.
    std::vector<float> sum(n);
    if (int8) sum = int8_exchange(pseudo, residuals);
    else if (bf16) sum = bf16_exchange(pseudo, residuals, fb, fe);
    else
      for (std::size_t i = 0; i < n; ++i) sum[i] = (pseudo[0][i] + pseudo[1][i]) + (pseudo[2][i] + pseudo[3][i]);
    const std::span<float> slots[1] = {std::span<float>(run.outer_slot).subspan(fb, fe - fb)};
    const auto scale = static_cast<float>(1.0 / static_cast<double>(weights));
    if (delayed) {
      std::vector<float> fresh(n);
      for (std::size_t i = 0; i < n; ++i) fresh[i] = sum[i] * scale;
      optimizer_step(outer, run.global, run.held, std::span<const std::span<float>>(slots, outer_momentum != 0.0 ? 1 : 0),
                     1.0f, outer_lr, r);
      if (r == last_step) {
        optimizer_step(outer, run.global, fresh, std::span<const std::span<float>>(slots, outer_momentum != 0.0 ? 1 : 0),
                       1.0f, outer_lr, r + 1);
        std::fill(fresh.begin(), fresh.end(), 0.0f);
      }
      run.held = fresh;
      continue;
    }
    optimizer_step(outer, std::span<float>(run.global).subspan(fb, fe - fb), std::span<float>(sum).subspan(fb, fe - fb),
                   slots, static_cast<float>(1.0 / static_cast<double>(weights)), outer_lr, r);
  }
  return run;
}

// In the checkpoint's tensor order.
std::vector<float> by_tensor(const job_config& c, const std::vector<float>& flat) {
  std::vector<float> out;
  const flat_layout layout = mlp_layout(c.model);
  for (const auto& t : layout.tensors())
    out.insert(out.end(), flat.begin() + static_cast<std::ptrdiff_t>(t.offset),
               flat.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()));
  return out;
}

// Every logical worker's progress (sync.delay), worker after worker, in the
// checkpoint's tensor order.
std::vector<float> worker_progress(const std::filesystem::path& checkpoint, const job_config& c) {
  const auto file = load_safetensors(checkpoint / "workers.safetensors");
  std::vector<float> values;
  const flat_layout layout = mlp_layout(c.model);
  for (std::int64_t k = 0; k < c.sync.workers; ++k)
    for (const auto& t : layout.tensors()) {
      const auto* found = file.find("worker." + std::to_string(k) + ".progress." + t.name);
      if (found == nullptr) return {};
      values.insert(values.end(), found->values.begin(), found->values.end());
    }
  return values;
}

std::vector<float> optimizer_values(const std::filesystem::path& checkpoint) {
  std::vector<float> values;
  for (const auto& t : load_safetensors(checkpoint / "optimizer.safetensors").tensors)
    values.insert(values.end(), t.values.begin(), t.values.end());
  return values;
}

job_config round_job(std::int64_t devices, sync_mode mode, const std::filesystem::path& dir,
                     sync_codec codec = sync_codec::fp32, std::int64_t fragments = 1, std::int64_t delay = 0) {
  // With fragments, 905 samples: the epoch's last step (9 samples) gives
  // the workers shares of 3, 3, 3 and none, so the weights of the
  // fragments' exchanges differ and the last worker contributes its earlier
  // progress without a row of its own (See Note [Fragments]); the run goes
  // on into the next epoch.
  job_config c = testing::small_job(devices, 64, fragments > 1 ? 905 : 1024);
  c.sync.codec = codec;
  c.sync.fragments = fragments;
  c.sync.delay = delay;
  if (delay > 0) c.train.checkpoint_every = 1;  // the round before the last holds an update not applied yet
  c.schedule.kind = schedule_kind::step;  // the inner rate falls every inner step: a position off by one shows
  c.schedule.step_size = 1;
  c.schedule.gamma = 0.9;
  c.sync.mode = mode;
  c.sync.workers = 4;
  c.sync.every = 4;
  c.sync.outer_lr = 0.7;  // DiLoCo's, set (the default rule would give 0.175 at H = 4: TheDefaultOuterRate...)
  c.train.max_steps = fragments > 1 ? 10 : 3;  // three rounds; with fragments an epoch of 8 steps and two more
  c.train.epochs = 2;
  c.train.checkpoint_dir = dir.string();
  return c;
}

struct reference_case {
  sync_mode mode;
  sync_codec codec = sync_codec::fp32;
  std::int64_t fragments = 1;
  std::int64_t delay = 0;
};

std::string reference_case_name(const reference_case& c) {
  return std::string(c.mode == sync_mode::diloco ? "diloco" : "local_sgd") +
         (c.codec == sync_codec::int8   ? "_int8"
          : c.codec == sync_codec::bf16 ? "_bf16"
                                        : "") +
         (c.fragments > 1 ? "_fragments" : "") + (c.delay > 0 ? "_delay" : "");
}
// gtest prints the parameter in the test's listed name: its name, not its bytes.
void PrintTo(const reference_case& c, std::ostream* os) { *os << reference_case_name(c); }

class ReferenceRounds : public ::testing::TestWithParam<reference_case> {};

TEST_P(ReferenceRounds, TheEngineMatchesAPlainLoopBitwiseForThreeRoundsOnOneAndTwoDevices) {
  const sync_mode mode = GetParam().mode;
  const sync_codec codec = GetParam().codec;
  const std::int64_t fragments = GetParam().fragments;
  const std::int64_t delay = GetParam().delay;
  const bool diloco = mode == sync_mode::diloco;
  testing::scratch_dir dir;
  const job_config shape = round_job(1, mode, dir / "shape", codec, fragments, delay);
  const int steps = static_cast<int>(shape.train.max_steps);
  const auto reference = [&](const job_config& c, int rounds, int last_step = -1) {
    return diloco ? reference_rounds(c, rounds, 0.7, 0.9, true, last_step)
                  : reference_rounds(c, rounds, 1.0, 0.0, false, last_step);
  };
  const reference_run expected = reference(shape, steps);
  // The outer optimizer's file: the momentum (diloco), then with the delay
  // the update it holds.
  const auto outer_file = [&](const reference_run& r) {
    std::vector<float> values = diloco ? by_tensor(shape, r.outer_slot) : std::vector<float>{};
    if (delay > 0) {
      const std::vector<float> held = by_tensor(shape, r.held);
      values.insert(values.end(), held.begin(), held.end());
    }
    return values;
  };
  const auto progress_file = [&](const reference_run& r) {
    std::vector<float> values;
    for (const auto& d : r.progress) {
      const std::vector<float> one = by_tensor(shape, d);
      values.insert(values.end(), one.begin(), one.end());
    }
    return values;
  };
  for (const std::int64_t devices : {1, 2}) {
    SCOPED_TRACE(std::to_string(devices) + " device(s)");
    const job_config c = round_job(devices, mode, dir / ("d" + std::to_string(devices)), codec, fragments, delay);
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, steps);
    EXPECT_EQ(testing::checkpoint_parameters(s.checkpoint), by_tensor(c, expected.global));
    EXPECT_EQ(optimizer_values(s.checkpoint), outer_file(expected));
    if (delay > 0) {
      // Two rounds in: the second round's update is held, not applied.
      const reference_run two = reference(shape, 2, steps - 1);
      const std::filesystem::path second = std::filesystem::path(c.train.checkpoint_dir) / "step-00000002";
      EXPECT_EQ(testing::checkpoint_parameters(second), by_tensor(c, two.global));
      EXPECT_EQ(optimizer_values(second), outer_file(two));
      EXPECT_NE(two.held, std::vector<float>(two.held.size(), 0.0f));
      EXPECT_EQ(worker_progress(second, c), progress_file(two));
      // The last round is applied at once: nothing is held after it.
      EXPECT_EQ(worker_progress(s.checkpoint, c), progress_file(expected));
      EXPECT_EQ(expected.held, std::vector<float>(expected.held.size(), 0.0f));
      EXPECT_EQ(progress_file(expected), std::vector<float>(progress_file(expected).size(), 0.0f));
    }
    if (delay > 0) {
      // See Note [Overlapped delayed rounds]: without a checkpoint between
      // them (a snapshot waits for the exchange in flight) and with the
      // rounds in one message, round 0's exchange runs during round 1 on
      // every device; the same bytes.
      job_config overlapped = c;
      overlapped.train.checkpoint_dir = (dir / ("o" + std::to_string(devices))).string();
      overlapped.train.checkpoint_every = 0;
      overlapped.train.steps_per_message = steps;
      Engine again(overlapped);
      again.start();
      const run_summary o = again.wait();
      EXPECT_EQ(o.overlapped_exchanges, devices) << "round 0's exchange did not overlap round 1";
      EXPECT_EQ(testing::checkpoint_parameters(o.checkpoint), by_tensor(c, expected.global));
      EXPECT_EQ(optimizer_values(o.checkpoint), outer_file(expected));
    }
  }
  if (delay > 0) {  // the comparison can tell the delay from none
    job_config none = shape;
    none.sync.delay = 0;
    EXPECT_NE(by_tensor(shape, reference(none, steps).global), by_tensor(shape, expected.global));
  }
  if (codec != sync_codec::fp32) {  // the comparison can tell the codec from fp32
    job_config fp32 = shape;
    fp32.sync.codec = sync_codec::fp32;
    EXPECT_NE(by_tensor(shape, reference_rounds(fp32, steps, 0.7, 0.9, true).global), by_tensor(shape, expected.global));
  }
  if (fragments > 1 && codec == sync_codec::fp32) {  // the comparison can tell streaming from plain rounds of H / P
    job_config plain = shape;
    plain.sync.fragments = 1;
    plain.sync.every = shape.sync.every / fragments;
    EXPECT_NE(by_tensor(shape, reference_rounds(plain, steps, 0.7, 0.9, true).global), by_tensor(shape, expected.global));
  }
  // The comparison can tell a different outer step.
  const reference_run other =
      diloco ? reference_rounds(shape, steps, 0.7, 0.0, false) : reference_rounds(shape, steps, 0.9, 0.0, false);
  EXPECT_NE(by_tensor(shape, other.global), by_tensor(shape, expected.global));
}

INSTANTIATE_TEST_SUITE_P(Modes, ReferenceRounds,
                         ::testing::Values(reference_case{sync_mode::local_sgd}, reference_case{sync_mode::diloco},
                                           reference_case{sync_mode::diloco, sync_codec::int8},
                                           reference_case{sync_mode::diloco, sync_codec::fp32, 2},
                                           reference_case{sync_mode::diloco, sync_codec::bf16, 2},
                                           reference_case{sync_mode::local_sgd, sync_codec::fp32, 1, 1},
                                           reference_case{sync_mode::diloco, sync_codec::fp32, 1, 1},
                                           reference_case{sync_mode::diloco, sync_codec::int8, 1, 1},
                                           reference_case{sync_mode::diloco, sync_codec::bf16, 1, 1}),
                         [](const auto& info) { return reference_case_name(info.param); });


// The config_error that the default job with `sets` gives, before training.
std::string sync_error(const std::vector<std::string>& sets) {
  const std::string text = testing::read_text(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  return testing::error_of<config_error>([&] { parse_job_config(text, "mlp.cfg", sets); });
}

// sync.outer_lr = 0, the default (sync_config::outer_rate): DiLoCo's 0.7,
// scaled by H / 16 below H = 16 and halved with the one-round delay; a rate
// set is kept.
TEST(RoundsConfig, TheDefaultOuterRateFollowsHAndTheDelay) {
  const auto rate = [](std::int64_t every, std::int64_t delay, double set = 0.0) {
    sync_config s;
    s.every = every;
    s.delay = delay;
    s.outer_lr = set;
    return s.outer_rate();
  };
  EXPECT_EQ(sync_config{}.outer_lr, 0.0);
  EXPECT_EQ(rate(16, 0), 0.7);
  EXPECT_EQ(rate(64, 0), 0.7);
  EXPECT_EQ(rate(4, 0), 0.175);
  EXPECT_EQ(rate(16, 1), 0.35);
  EXPECT_EQ(rate(4, 1), 0.0875);
  EXPECT_EQ(rate(4, 1, 0.5), 0.5);
  // The engine applies it: three rounds of H = 4 at the default rate are the
  // plain loop's at 0.175.
  testing::scratch_dir dir;
  job_config c = round_job(1, sync_mode::diloco, dir / "default");
  c.sync.outer_lr = 0.0;
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_EQ(testing::checkpoint_parameters(s.checkpoint), by_tensor(c, reference_rounds(c, 3, 0.175, 0.9, true).global));
  EXPECT_NE(by_tensor(c, reference_rounds(c, 3, 0.7, 0.9, true).global),
            by_tensor(c, reference_rounds(c, 3, 0.175, 0.9, true).global));
}

TEST(RoundsConfig, BadInputIsRefusedNamingTheKeyAndTheValue) {
  EXPECT_NE(sync_error({"sync.every=0"}).find("sync.every"), std::string::npos) << sync_error({"sync.every=0"});
  const std::string codec = sync_error({"sync.mode=\"diloco\"", "sync.codec=\"int4\""});
  EXPECT_NE(codec.find("sync.codec"), std::string::npos) << codec;
  EXPECT_NE(codec.find("int4"), std::string::npos) << codec;
  const std::string mode = sync_error({"sync.mode=\"gossip\""});
  EXPECT_NE(mode.find("sync.mode"), std::string::npos) << mode;
  EXPECT_NE(mode.find("gossip"), std::string::npos) << mode;
  // 784-256-128-10 has 235,146 parameters.
  const std::string fragments = sync_error({"sync.mode=\"diloco\"", "sync.fragments=235147"});
  EXPECT_NE(fragments.find("sync.fragments = 235147 is more than the model's 235146 parameters"), std::string::npos)
      << fragments;
  const std::string split = sync_error({"sync.mode=\"diloco\"", "sync.workers=3"});
  EXPECT_NE(split.find("train.batch_size = 128 does not split evenly over sync.workers = 3"), std::string::npos) << split;
  const std::string gpus = sync_error({"sync.mode=\"diloco\"", "cluster.gpus=[0]"});
  EXPECT_NE(gpus.find("CPU replicas only"), std::string::npos) << gpus;
  // Fast mode (See Note [Fast rounds across processes]).
  EXPECT_EQ(sync_error({"sync.mode=\"local_sgd\"", "train.reproducible=false"}), testing::no_error);
  const std::string split_h = sync_error({"sync.mode=\"diloco\"", "sync.every=16", "sync.fragments=3"});
  EXPECT_NE(split_h.find("sync.every = 16 does not split into sync.fragments = 3 equal parts"), std::string::npos)
      << split_h;
  EXPECT_EQ(sync_error({"sync.mode=\"diloco\"", "sync.every=16", "sync.fragments=4"}), testing::no_error);
  EXPECT_EQ(sync_error({"sync.mode=\"diloco\"", "sync.delay=1"}), testing::no_error);
  EXPECT_EQ(sync_error({"sync.mode=\"local_sgd\"", "sync.delay=1", "sync.codec=\"int8\""}), testing::no_error);
  const std::string delay = sync_error({"sync.delay=1"});
  EXPECT_NE(delay.find("sync.delay = 1 needs a round mode"), std::string::npos) << delay;
  const std::string delay_fragments =
      sync_error({"sync.mode=\"diloco\"", "sync.delay=1", "sync.every=16", "sync.fragments=2"});
  EXPECT_NE(delay_fragments.find("sync.delay = 1 with sync.fragments = 2 is not built yet"), std::string::npos)
      << delay_fragments;
  const std::string delay_two = sync_error({"sync.mode=\"diloco\"", "sync.delay=2"});
  EXPECT_NE(delay_two.find("sync.delay"), std::string::npos) << delay_two;
  EXPECT_EQ(sync_error({"sync.mode=\"diloco\"", "sync.codec=\"bf16\""}), testing::no_error);
  EXPECT_EQ(sync_error({"sync.mode=\"diloco\"", "sync.workers=4", "sync.every=64"}), testing::no_error);
  EXPECT_EQ(sync_error({"sync.mode=\"diloco\"", "sync.codec=\"int8\""}), testing::no_error);
}

TEST(RoundsConfig, ATorchModelIsRefusedBeforeTraining) {
  job_config torch = testing::small_job(testing::replica_kind::torch, 1, 64);
  torch.sync.mode = sync_mode::diloco;
  const std::string message = testing::error_of<config_error>([&] { Engine engine(torch); engine.start(); });
  EXPECT_NE(message.find("native MLP replicas only"), std::string::npos) << message;
}

std::string file_bytes(const std::filesystem::path& checkpoint) {
  return testing::read_text(checkpoint / "model.safetensors") + testing::read_text(checkpoint / "optimizer.safetensors") +
         testing::read_text(checkpoint / "workers.safetensors");
}

// See Note [Overlapped delayed rounds]: a round that is not finite is found
// only when its exchange ends, after the next round computed from a start
// that assumed it would apply. With train.on_nonfinite = "skip" that round
// is computed again (from the replica's own parameters); with "stop" the run
// stops with the state before it. Either way the bytes of the run whose
// exchanges run between the rounds. The eight rounds (two epochs of four)
// are one shard message, so that each round's exchange runs during the next
// round but round 3's (the next epoch's rounds are issued once the epoch's
// last round has committed, after its exchange) and round 6's (the last
// round applies both updates at once: it starts after round 6's exchange
// ends). With each codec, whose workers' residuals of round 2 round 3 waits
// for, and which a skipped round does not write.
class RoundsOverlap : public ::testing::TestWithParam<sync_codec> {};

TEST_P(RoundsOverlap, ANonFiniteRoundGivesTheBytesOfTheRunWithoutTheOverlap) {
  const sync_codec codec = GetParam();
  testing::scratch_dir dir;
  {
    job_config c = round_job(2, sync_mode::diloco, dir / "quiet", codec, 1, 1);
    c.train.checkpoint_every = 0;
    c.train.max_steps = 8;
    c.train.steps_per_message = 8;
    Engine engine(c);
    engine.start();
    EXPECT_EQ(engine.wait().overlapped_exchanges, 2 * 5) << "rounds 1, 2, 3, 5 and 6 on each device start from the preview";
  }
  // Round 2, whose exchange runs during round 3; and (skipped) round 0,
  // whose held update is zeros: the preview leaves the parameters as the
  // skipped round does, and round 1 is computed again all the same, as the
  // workers' states it started from were set back.
  for (const auto& [policy, fault] : {std::pair{nonfinite_policy::skip, "nan:1@3"}, std::pair{nonfinite_policy::stop, "nan:1@3"},
                                      std::pair{nonfinite_policy::skip, "nan:1@1"}}) {
    const std::string name = std::string(policy == nonfinite_policy::skip ? "skip" : "stop") + "-" + fault;
    SCOPED_TRACE(name);
    std::vector<std::string> files;
    std::vector<std::int64_t> overlapped;
    for (const bool overlap : {true, false}) {
      job_config c = round_job(2, sync_mode::diloco, dir / (name + (overlap ? "-on" : "-off")), codec, 1, 1);
      c.train.checkpoint_every = 0;
      c.train.max_steps = 8;
      c.train.steps_per_message = 8;
      c.train.on_nonfinite = policy;
      c.sync.overlap = overlap;
      c.faults.inject = {fault};
      Engine engine(c);
      engine.start();
      std::string checkpoint;
      try {
        const run_summary s = engine.wait();
        EXPECT_EQ(policy, nonfinite_policy::skip) << "the run did not stop";
        checkpoint = s.checkpoint;
        overlapped.push_back(s.overlapped_exchanges);
      } catch (const error& e) {
        EXPECT_EQ(policy, nonfinite_policy::stop) << e.what();
        checkpoint = (std::filesystem::path(c.train.checkpoint_dir) / "step-00000002").string();
      }
      ASSERT_TRUE(std::filesystem::exists(checkpoint)) << checkpoint;
      files.push_back(file_bytes(checkpoint));
    }
    EXPECT_TRUE(files[0] == files[1]) << "the overlapped run's bytes differ";
    if (policy == nonfinite_policy::skip) {
      EXPECT_GT(overlapped[0], 0) << "nothing overlapped: the test would prove nothing";
      EXPECT_EQ(overlapped[1], 0);
    }
  }
}

// See slice_work::discard: a round whose values were not finite, skipped,
// leaves every logical worker the state it started the round from (its
// inner optimizer's slots, residual and progress): the next round starts
// from the state before it, not from what the non-finite round made.
TEST_P(RoundsOverlap, ASkippedRoundLeavesItsWorkersTheStateTheyStartedItFrom) {
  testing::scratch_dir dir;
  job_config c = round_job(2, sync_mode::diloco, dir / "skip", GetParam(), 1, 1);
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 0;
  c.train.max_steps = 4;
  c.train.on_nonfinite = nonfinite_policy::skip;
  c.faults.inject = {"nan:1@3"};  // round 2
  Engine engine(c);
  engine.start();
  engine.wait();
  const std::filesystem::path at = c.train.checkpoint_dir;
  const auto workers = [&](const char* step) { return testing::read_text(at / step / "workers.safetensors"); };
  EXPECT_TRUE(workers("step-00000002") == workers("step-00000003")) << "round 2 changed its workers' states";
  EXPECT_FALSE(workers("step-00000003") == workers("step-00000004")) << "round 3 did not (the comparison proves nothing)";
}

}  // namespace
// The same for a codec (found by argument-dependent lookup: in dpactor).
void PrintTo(sync_codec codec, std::ostream* os) { *os << sync_codec_name(codec); }
namespace {

INSTANTIATE_TEST_SUITE_P(Codecs, RoundsOverlap, ::testing::Values(sync_codec::fp32, sync_codec::int8, sync_codec::bf16),
                         [](const auto& info) { return std::string(sync_codec_name(info.param)); });

// A run that stops (here below cluster.min_devices) writes the state of
// its last committed round with every logical worker's state after that
// round, taken from a survivor's store: its resume ends with the bytes of
// the run never stopped.
TEST(RoundsResume, ARunStoppedBelowTheMinimumCheckpointsItsWorkersAndResumesToTheBytesOfTheRunNeverStopped) {
  testing::scratch_dir dir;
  job_config whole = round_job(2, sync_mode::diloco, dir / "whole");
  whole.train.max_steps = 0;  // 2 epochs of 4 rounds
  {
    Engine e(whole);
    e.start();
    ASSERT_EQ(e.wait().steps, 8);
  }
  job_config stopped = round_job(2, sync_mode::diloco, dir / "stopped");
  stopped.train.max_steps = 0;
  stopped.cluster.min_devices = 2;
  stopped.faults.inject = {"fail:1@5"};
  const std::string why = testing::error_of<training_error>([&] {
    Engine e(stopped);
    e.start();
    e.wait();
  });
  EXPECT_NE(why.find("fewer than cluster.min_devices = 2"), std::string::npos) << why;
  EXPECT_NE(why.find("checkpoint written to"), std::string::npos) << why;
  ASSERT_TRUE(std::filesystem::exists(dir / "stopped" / "step-00000004" / "workers.safetensors"));
  job_config again = whole;
  again.cluster.cpus = 1;
  again.train.checkpoint_dir = (dir / "resumed").string();
  {
    Engine resumed(again, testing::resume_from(dir / "stopped"));
    resumed.start();
    ASSERT_EQ(resumed.wait().steps, 8);
  }
  EXPECT_EQ(file_bytes(dir / "resumed" / "step-00000008"), file_bytes(dir / "whole" / "step-00000008"));
}

// A checkpoint holds the global weights, the outer momentum and every logical
// worker's inner state: a resume mid-epoch, on another number of devices,
// ends with the bytes of the run that wrote it.
TEST(RoundsResume, AResumeFromAMidEpochCheckpointOnOneDeviceEndsWithTheBytesOfTheRunThatWroteIt) {
  testing::scratch_dir dir;
  job_config c = round_job(2, sync_mode::diloco, dir / "first");
  c.train.max_steps = 0;
  c.train.epochs = 2;            // 4 rounds an epoch, 8 in all
  c.train.checkpoint_every = 3;  // step-3 is mid-epoch
  {
    Engine first(c);
    first.start();
    ASSERT_EQ(first.wait().steps, 8);
  }
  ASSERT_TRUE(std::filesystem::exists(dir / "first" / "step-00000003" / "workers.safetensors"));
  job_config again = c;
  again.cluster.cpus = 1;
  again.train.checkpoint_dir = (dir / "resumed").string();
  {
    Engine resumed(again, testing::resume_from(dir / "first" / "step-00000003"));
    resumed.start();
    ASSERT_EQ(resumed.wait().steps, 8);
  }
  EXPECT_EQ(file_bytes(dir / "resumed" / "step-00000008"), file_bytes(dir / "first" / "step-00000008"));
  // The resumed run started from the checkpoint's workers, not fresh ones:
  // the comparison can tell (a fresh start from step 3's global weights).
  EXPECT_NE(file_bytes(dir / "first" / "step-00000003"), file_bytes(dir / "first" / "step-00000006"));

  // Another mode, or other logical workers, are refused naming both.
  job_config other = again;
  other.train.checkpoint_dir = (dir / "other").string();
  other.sync.mode = sync_mode::local_sgd;
  std::string message = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(dir / "first" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(message.find("sync.mode = \"diloco\", this config has sync.mode = \"local_sgd\""), std::string::npos)
      << message;
  other.sync.mode = sync_mode::every_step;
  message = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(dir / "first" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(message.find("sync.mode = \"diloco\", this config has sync.mode = \"every_step\""), std::string::npos)
      << message;
  other.sync.mode = sync_mode::diloco;
  other.sync.workers = 2;
  message = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(dir / "first" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(message.find("the checkpoint has 4 logical workers, this config has sync.workers = 2"), std::string::npos)
      << message;
  other.sync.workers = 4;
  other.sync.codec = sync_codec::int8;
  message = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(dir / "first" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(message.find("sync.codec = \"fp32\", this config has sync.codec = \"int8\""), std::string::npos)
      << message;
  other.sync.codec = sync_codec::fp32;
  other.sync.fragments = 2;
  message = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(dir / "first" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(message.find("sync.fragments = 1, this config has sync.fragments = 2"), std::string::npos) << message;
  other.sync.fragments = 1;
  other.sync.delay = 1;
  message = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(dir / "first" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(message.find("sync.delay = 0, this config has sync.delay = 1"), std::string::npos) << message;
}

// diloco on 3 devices, 4 workers, H = 4, through a failure, a join, a hang
// and a leave (hang timeout 0.5 s).
job_config diloco_through_faults() {
  job_config c = testing::faulty_job(3, {"fail:1@3", "join:cpu@5", "hang:2@7", "leave:0@10"}, testing::replica_kind::mlp);
  c.sync.mode = sync_mode::diloco;
  c.sync.workers = 4;
  c.sync.every = 4;
  c.cluster.hang_timeout_s = 0.5;
  return c;
}

// Every sample once, by the devices' own account (trained events, not the
// ledger): a round's samples count when it commits, and a round that a
// failure interrupts is run again from its start, so none is trained twice.
TEST(RoundsFaults, EverySampleOnceWithAFailureAHangAJoinAndALeaveMidRun) {
  // 16 steps of 64 an epoch: with H = 4, four rounds an epoch, twelve in all.
  job_config c = diloco_through_faults();
  const testing::recorded_run faulty = testing::run_recorded(c);
  EXPECT_EQ(faulty.summary.steps, 12);
  EXPECT_GE(faulty.summary.membership_changes, 4);
  testing::expect_exactly_once(faulty);
  // And the bytes of a quiet run on one device.
  job_config quiet = c;
  quiet.faults.inject.clear();
  quiet.cluster.cpus = 1;
  testing::scratch_dir dir;
  c.train.checkpoint_dir = (dir / "faulty").string();
  quiet.train.checkpoint_dir = (dir / "quiet").string();
  const testing::recorded_run a = testing::run_recorded(c), b = testing::run_recorded(quiet);
  EXPECT_EQ(testing::checkpoint_parameters(a.summary.checkpoint), testing::checkpoint_parameters(b.summary.checkpoint));
  EXPECT_EQ(optimizer_values(a.summary.checkpoint), optimizer_values(b.summary.checkpoint));
}

// Fast mode in one process (See Note [Fast rounds across processes]): a
// failed device's workers are still in the process's store, so a failure, a
// hang, a join and a leave lose nothing; with two BLAS threads a replica
// (reproducible mode pins one), every sample once.
TEST(RoundsFaults, InFastModeEverySampleOnceWithAFailureAHangAJoinAndALeave) {
  job_config c = diloco_through_faults();
  c.train.reproducible = false;
  c.cluster.blas_threads = 2;
  const testing::recorded_run fast = testing::run_recorded(c);
  EXPECT_EQ(fast.summary.steps, 12);
  EXPECT_GE(fast.summary.membership_changes, 4);
  testing::expect_exactly_once(fast);
}

}  // namespace
}  // namespace dpactor
