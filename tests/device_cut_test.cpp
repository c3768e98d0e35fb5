// A cut returns exactly the untouched indices (Note [Cutting a step short]).
// The device actor runs a replica that requests the cut itself after its
// second micro-batch, so the test needs no timing: the device must stop
// there, join the collective with what it has, and report the rest.

#include <gtest/gtest.h>

#include <numeric>

#include <caf/all.hpp>

#include "actors/device.hpp"
#include "actors/protocol.hpp"
#include "comms/local.hpp"

namespace dpactor {
namespace {

// A replica that counts rows and asks for a cut of `cut_step` after
// `cut_after` micro-batches.
class cutting_replica final : public replica {
 public:
  cutting_replica(std::shared_ptr<device_control> control, std::int64_t cut_step, int cut_after)
      : control_(std::move(control)), cut_step_(cut_step), cut_after_(cut_after),
        layout_(make_state_layout(spec_, optimizer_config{})), state_(layout_.total_size()), grads_(layout_.parameter_size),
        sections_{std::span<float>(state_).first(layout_.parameter_size)} {}

  const state_layout& layout() const noexcept override { return layout_; }
  std::size_t max_rows() const noexcept override { return 2; }
  void zero_grad() override {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    samples_ = 0;
  }
  batch_stats accumulate(const batch_ref& rows, gradient_listener*) override {
    trained.insert(trained.end(), rows.indices.begin(), rows.indices.end());
    samples_ += static_cast<double>(rows.indices.size());
    if (++calls_ == cut_after_) control_->cut_step.store(cut_step_);
    return {0.0, 0, static_cast<std::int64_t>(rows.indices.size())};
  }
  batch_stats evaluate(const batch_ref&) override { return {}; }
  double samples() const override { return samples_; }
  std::span<float> gradients() override { return grads_; }
  void apply_update(double, double, std::size_t, std::size_t) override {}
  void finish_step() override { write_step_counter(state_, layout_, optimizer_steps() + 1); }
  void skip_step() override { finish_step(); }
  std::span<const std::span<float>> state_sections() override { return sections_; }
  std::span<float> state_buffer() override { return state_; }
  std::int64_t optimizer_steps() const override { return read_step_counter(state_, layout_); }
  std::vector<float> export_state() const override { return state_; }
  void import_state(std::span<const float> s) override { std::copy(s.begin(), s.end(), state_.begin()); }
  void copy_parameters(std::span<float>) const override {}
  std::uint64_t state_checksum() const override { return 0; }

  std::vector<std::uint32_t> trained;

 private:
  mlp_spec spec_{{4, 2}, activation::relu, loss_kind::cross_entropy};
  std::shared_ptr<device_control> control_;
  std::int64_t cut_step_;
  int cut_after_;
  int calls_ = 0;
  state_layout layout_;
  std::vector<float> state_;
  std::vector<float> grads_;
  std::vector<std::span<float>> sections_;
  double samples_ = 0;
};

TEST(DeviceCut, ReturnsExactlyTheUntouchedIndices) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};

  auto data = std::make_shared<dataset>("rows", 20, 4, 2);
  auto setup = std::make_shared<device_setup>();
  setup->name = "cpu:0";
  setup->control = std::make_shared<device_control>();
  auto model = std::make_unique<cutting_replica>(setup->control, /*cut_step=*/3, /*cut_after=*/2);
  cutting_replica* replica_view = model.get();
  setup->model = std::move(model);
  setup->train = data;
  setup->test = data;
  const device_actor device = system.spawn<caf::detached>(device_behavior, setup);

  group_ticket ticket{"local", 0, "", make_local_group(1)};
  self->send(device, begin_generation_msg{0, caf::actor_cast<reducer_actor>(self), 0, 1, 0, ticket});
  const std::vector<std::uint32_t> shard{11, 3, 7, 19, 0, 5, 2};
  self->send(device, shard_msg{0, {step_shard{3, 0, shard, 0, 0, 0, nullptr}}});

  shard_cut_msg cut;
  self->receive([&](shard_cut_msg& m) { cut = std::move(m); });
  EXPECT_EQ(cut.step, 3);
  EXPECT_EQ(cut.samples, 4) << "two micro-batches of two rows";
  EXPECT_EQ(cut.returned, (std::vector<std::uint32_t>{0, 5, 2})) << "the untouched tail of the shard, in order";
  self->receive([&](steps_done_msg& m) {
    ASSERT_EQ(m.steps.size(), 1u);
    EXPECT_EQ(m.steps[0].step, 3);
    EXPECT_EQ(m.steps[0].samples, 4) << "the step completes with what was computed";
    EXPECT_EQ(m.steps[0].member_returned, std::vector<float>{3.0f});
  });
  EXPECT_EQ(replica_view->trained, (std::vector<std::uint32_t>{11, 3, 7, 19}));
  self->send_exit(device, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace dpactor
