#include "actors/checkpoint_writer.hpp"

#include "train/checkpoint.hpp"

namespace dpactor {

caf::behavior checkpoint_writer_actor(caf::event_based_actor* self, std::shared_ptr<const checkpoint_writer_setup> setup) {
  return {
      [self, setup](const write_checkpoint_msg& msg) {
        trainer_record record;
        record.step = msg.step + 1;
        record.epoch = msg.position.epoch;
        record.position = msg.position;
        record.seed = setup->seed;
        record.shuffle = setup->shuffle;
        record.train_samples = setup->train_samples;
        record.config = setup->config_toml;
        checkpoint_written_msg reply{msg.step, {}, {}};
        try {
          reply.path = write_checkpoint(setup->root, setup->layout, msg.state, record, setup->keep).string();
        } catch (const std::exception& e) {
          reply.error = e.what();
        }
        self->send(caf::actor_cast<caf::actor>(self->current_sender()), std::move(reply));
      },
  };
}

}  // namespace dpactor
