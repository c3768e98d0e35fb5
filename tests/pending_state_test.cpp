// Note [Pending state]: a step whose collective is aborted half-way leaves
// the replica's current state exactly as it was after the previous step.

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "train/step_runner.hpp"
#include "comms/local.hpp"
#include "data/synthetic.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/gemm.hpp"

namespace dpactor {
namespace {

const mlp_spec spec{{16, 12, 4}, activation::relu, loss_kind::cross_entropy};

dataset small_data(std::size_t rows) {
  synthetic_options o;
  o.rows = rows;
  o.features = 16;
  o.classes = 4;
  return make_synthetic(o);
}

TEST(PendingState, AnAbortBetweenUpdateAndGatherLeavesTheStateUntouched) {
  set_blas_threads(1);
  const dataset data = small_data(256);
  auto group = make_local_group(2);
  lr_schedule schedule;
  std::vector<float> before, after;
  std::atomic<bool> rank1_done{false};
  std::thread rank1([&] {
    // Takes part in the step up to the update, then stops: it never gathers.
    cpu_replica model(spec, optimizer_config{}, 32);
    auto comm = group->endpoint(1);
    std::vector<float> header(h_members + 3 * 2, 0.0f);
    comm->all_reduce_sum(header, {});
    model.zero_grad();
    comm->reduce_scatter_sum(model.gradients(), {});
    rank1_done = true;
  });
  cpu_replica model(spec, optimizer_config{}, 32);
  std::vector<float> init(model.layout().total_size(), 0.0f);
  init_mlp_parameters(spec, std::span<float>(init).first(model.layout().parameter_size), 5);
  model.import_state(init);
  before = model.export_state();
  step_runner runner(0, {}, 1, 1.5, 0.0005);
  device_control control;
  auto comm = group->endpoint(0);
  std::vector<std::uint32_t> rows(32);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>(i * 3);
  const auto c = runner.compute(step_shard{0, 0, rows, 0, 0, 0, nullptr}, model, data, control, *group);
  std::thread aborter([&] {
    while (!rank1_done) std::this_thread::yield();
    group->abort();  // rank 0 is in (or about to enter) the all-gather
  });
  EXPECT_THROW(runner.synchronize(c, 0, model, *comm, {}, nullptr, schedule), collective_error);
  aborter.join();
  rank1.join();
  after = model.export_state();
  EXPECT_EQ(after, before) << "the half-done step must not show in the current state";
  EXPECT_EQ(model.optimizer_steps(), 0);
}

// A member alone updates in place (replica::update_in_place): bitwise the
// step through the pending state, for each optimizer.
TEST(PendingState, AnUpdateInPlaceIsBitwiseTheStepThroughThePendingState) {
  set_blas_threads(1);
  const dataset data = small_data(64);
  std::vector<std::uint32_t> rows(40);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>(i);
  optimizer_config sgd, nesterov, adamw;
  nesterov.nesterov = true;
  nesterov.weight_decay = 0.01;
  adamw.kind = optimizer_kind::adamw;
  adamw.weight_decay = 0.01;
  for (const optimizer_config& opt : {sgd, nesterov, adamw}) {
    cpu_replica pending(spec, opt, 16), in_place(spec, opt, 16);
    std::vector<float> init(pending.layout().total_size(), 0.0f);
    init_mlp_parameters(spec, std::span<float>(init).first(pending.layout().parameter_size), 7);
    pending.import_state(init);
    in_place.import_state(init);
    for (int step = 0; step < 4; ++step) {
      for (cpu_replica* r : {&pending, &in_place}) {
        r->zero_grad();
        for (std::size_t b = 0; b < rows.size(); b += 16)
          r->accumulate(data.batch(std::span<const std::uint32_t>(rows).subspan(b, std::min<std::size_t>(16, rows.size() - b))));
      }
      pending.apply_update(0.05, pending.samples(), 0, pending.layout().parameter_size);
      pending.finish_step();
      in_place.update_in_place(0.05, in_place.samples());
    }
    in_place.update_in_place(0.05, 0.0);  // no samples: the state carries over, the counter advances
    pending.apply_update(0.05, 0.0, 0, pending.layout().parameter_size);
    pending.finish_step();
    EXPECT_EQ(in_place.export_state(), pending.export_state()) << optimizer_name(opt.kind);
    EXPECT_EQ(in_place.optimizer_steps(), 5);
  }
}

}  // namespace
}  // namespace dpactor
