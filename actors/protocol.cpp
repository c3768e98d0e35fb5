#include "actors/protocol.hpp"

namespace dpactor {

void register_message_types(caf::actor_system_config& config) { config.add_message_types<caf::id_block::dpactor>(); }

}  // namespace dpactor
