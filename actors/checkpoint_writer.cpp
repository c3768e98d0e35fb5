#include "actors/checkpoint_writer.hpp"

#include "train/checkpoint.hpp"

namespace dpactor {

checkpoint_writer_actor::behavior_type checkpoint_writer_behavior(std::shared_ptr<const checkpoint_writer_setup> setup) {
  return {
      [setup](const write_checkpoint_msg& msg) {
        trainer_record record;
        record.step = msg.step + 1;
        record.position = msg.position;
        record.seed = setup->seed;
        record.shuffle = setup->shuffle;
        record.train_samples = setup->train_samples;
        record.data_fingerprint = setup->data_fingerprint;
        record.config = setup->config_toml;
        record.decisions = msg.decisions;
        checkpoint_written_msg reply{msg.step, {}, {}, msg.position.stream.committed};
        try {
          const std::span<const float> state(msg.state);
          const std::size_t replica = std::min(state.size(), setup->layout.total_size());
          worker_states workers;
          if (setup->inner)
            workers = {&*setup->inner, state.subspan(replica), setup->residual, setup->fragments, setup->delayed};
          powersgd_states powersgd;
          if (setup->powersgd) powersgd = {&*setup->powersgd, state.subspan(replica)};
          reply.path =
              setup->directory->write(setup->layout, state.first(replica), record, setup->keep, workers, powersgd).string();
        } catch (const std::exception& e) {
          reply.error = e.what();
        }
        return reply;
      },
  };
}

}  // namespace dpactor
