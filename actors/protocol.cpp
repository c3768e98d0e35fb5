#include "actors/protocol.hpp"

namespace dpactor {

caf::error error_of(const std::exception_ptr& x) {
  try {
    std::rethrow_exception(x);
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, e.what());
  } catch (...) {
    return caf::make_error(caf::sec::runtime_error, "an exception of unknown type");
  }
}

void register_message_types(caf::actor_system_config& config) { config.add_message_types<caf::id_block::dpactor>(); }

}  // namespace dpactor
