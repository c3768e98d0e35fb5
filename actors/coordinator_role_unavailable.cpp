// The coordinating role in a build without the Gloo backend (See
// actors/coordinator_role.hpp): refused before anything starts.

#include "actors/coordinator_role.hpp"

#include <dpactor/error.hpp>

namespace dpactor {

struct coordinator_role::state {};

namespace {

[[noreturn]] void unavailable() {
  throw config_error("this build of dpactor has no Gloo backend, which a coordinator needs (apt-get install "
                     "libgloo-dev, then build again)");
}

}  // namespace

std::unique_ptr<caf::actor_system_config> coordinator_role::system_config(const job_config&,
                                                                          const coordinator_options&) {
  unavailable();
}

coordinator_role::coordinator_role(caf::actor_system&, const coordinator_options&, const job_config&,
                                   const launch_plan&, const std::atomic<bool>&) {
  unavailable();
}

coordinator_role::~coordinator_role() = default;

const std::vector<member_handle>& coordinator_role::members() const noexcept {
  static const std::vector<member_handle> none;
  return none;
}

caf::actor coordinator_role::actor() const { return {}; }

void coordinator_role::steer(loader_setup&, reducer_setup&, const launch_plan&) const {}

void coordinator_role::attach(const reducer_actor&, const launch_plan&) {}

void coordinator_role::attach_async(const caf::actor&) {}

void coordinator_role::end_run(const std::string&) {}

}  // namespace dpactor
