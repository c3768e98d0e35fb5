#pragma once
// What the checkpoint writer receives: a checkpoint to write (a request,
// answered with checkpoint_written_msg).

#include <cstdint>
#include <string>
#include <vector>

#include "actors/actor_interfaces.hpp"
#include "actors/float_wire.hpp"
#include "actors/inspect_train_types.hpp"

namespace dpactor {

struct write_checkpoint_msg {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  bool final = false;
  std::vector<float> state;
  ledger_position position;
  std::string decisions;  // sync.mode = "async": its decisions so far, JSON Lines (trainer_record::decisions)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, write_checkpoint_msg& x) {
  std::vector<char> state;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("write_checkpoint_msg"), x.step, x.epoch, x.final, wire_out(state, x.state), state,
           wire_in(state, x.state), x.position, x.decisions);
}

struct checkpoint_written_msg {
  std::int64_t step = 0;
  std::string path;
  std::string error;  // empty on success
  std::int64_t committed_sequence = -1;  // stream mode: the position's committed sequence number
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_written_msg& x) {
  return f(caf::meta::type_name("checkpoint_written_msg"), x.step, x.path, x.error, x.committed_sequence);
}

}  // namespace dpactor
