#include "actors/device.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Runs fn over `rows` in slices of at most the replica's micro-batch.
template <class Fn>
batch_stats for_micro_batches(replica& model, const dataset& data, std::span<const std::uint32_t> rows, Fn fn) {
  batch_stats total;
  const std::size_t step = model.max_rows();
  for (std::size_t begin = 0; begin < rows.size(); begin += step) {
    const auto slice = rows.subspan(begin, std::min(step, rows.size() - begin));
    total += fn(data.batch(slice));
  }
  return total;
}

void report_failure(caf::stateful_actor<device_state>* self, std::int64_t step, const std::string& what) {
  auto& st = self->state;
  self->send(st.reducer, device_failed_msg{st.generation, step, st.rank, st.setup->name + ": " + what});
}

void run_step(caf::stateful_actor<device_state>* self, const shard_msg& shard) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  const auto start = clock_type::now();
  model.zero_grad();
  const batch_stats stats = for_micro_batches(model, *st.setup->train, shard.indices,
                                              [&](const batch_ref& b) { return model.accumulate(b); });
  self->send(st.reducer,
             computed_msg{st.generation, shard.step, st.rank, stats.samples, seconds_since(start)});
  st.comm->all_reduce_sum(model.reduce_buffer(), st.setup->collective);
  model.apply_step(st.setup->schedule.at(model.optimizer_steps()));
  st.last_step = shard.step;
  const std::uint64_t checksum = st.setup->verify_replicas ? model.parameter_checksum() : 0;
  self->send(st.reducer, step_done_msg{st.generation, shard.step, shard.epoch, st.rank, stats.loss_sum,
                                              stats.correct, stats.samples, checksum});
}

}  // namespace

caf::behavior device_actor(caf::stateful_actor<device_state>* self, std::shared_ptr<device_setup> setup) {
  self->state.setup = std::move(setup);
  return {
      [self](begin_generation_msg& msg) {
        auto& st = self->state;
        st.generation = msg.generation;
        st.rank = msg.rank;
        st.reducer = msg.reducer;
        try {
          st.comm = msg.group.local->endpoint(msg.rank);
          // Every member adopts the state source's parameters, optimizer state
          // and step counter (See Note [Replica state buffer]).
          st.comm->broadcast(st.setup->model->state_buffer(), msg.state_source, st.setup->collective);
        } catch (const std::exception& e) {
          report_failure(self, st.last_step, std::string("joining generation ") + std::to_string(msg.generation) +
                                                 " failed: " + e.what());
        }
      },
      [self](const shard_msg& shard) {
        auto& st = self->state;
        if (shard.generation != st.generation) return;  // planned for an ended generation
        try {
          run_step(self, shard);
        } catch (const std::exception& e) {
          report_failure(self, shard.step, e.what());
        }
      },
      [self](const evaluate_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.generation) return;
        st.eval_rows.resize(msg.end - msg.begin);
        std::iota(st.eval_rows.begin(), st.eval_rows.end(), msg.begin);
        try {
          replica& model = *st.setup->model;
          const batch_stats stats = for_micro_batches(model, *st.setup->test, st.eval_rows,
                                                      [&](const batch_ref& b) { return model.evaluate(b); });
          self->send(st.reducer, evaluated_msg{st.generation, msg.epoch, msg.step, msg.epoch_end, st.rank,
                                                      stats.loss_sum, stats.correct, stats.samples});
        } catch (const std::exception& e) {
          report_failure(self, msg.step, std::string("evaluation failed: ") + e.what());
        }
      },
      [self](const snapshot_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.generation) return;
        self->send(st.reducer, state_msg{msg.step, st.setup->model->export_state()});
      },
      [](const finish_msg&) {
        // Nothing more will come in this generation; the engine ends the actor.
      },
      [self](const params_request& req) {
        auto& st = self->state;
        params_reply reply;
        reply.step = st.setup->model->optimizer_steps();
        reply.values.resize(st.setup->model->layout().parameter_size);
        st.setup->model->copy_parameters(reply.values);
        req.reply->set_value(std::move(reply));
      },
  };
}

}  // namespace dpactor
