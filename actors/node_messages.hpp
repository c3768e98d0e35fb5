#pragma once
// Across nodes: what a worker and the coordinator actor say to each other
// (See Note [Coordinator and workers], actors/coordinator.hpp), and the
// rendezvous store the coordinator serves.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/actor_interfaces.hpp"

namespace dpactor {

// worker -> coordinator (request, answered with job_msg): the job it joins.
struct hello_msg {
  std::string version;  // dpactor_version of the worker
  std::string node;     // its name, for messages
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello_msg& x) {
  return f(caf::meta::type_name("hello_msg"), x.version, x.node);
}
struct job_msg {
  std::string config;  // the coordinator's effective config, TOML (dump_job_config)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_msg& x) {
  return f(caf::meta::type_name("job_msg"), x.config);
}
// worker -> coordinator (request, answered with joined_msg): its devices,
// ready, holding the job's initial state.
struct join_msg {
  std::string version;
  std::string node;
  std::string job_identity;      // the config its devices train (config/job_identity.hpp)
  std::string data_fingerprint;  // of its copy of the data
  std::vector<device_actor> devices;
  std::vector<std::string> names;  // "node/cpu:0", one per device
  std::vector<std::int32_t> gpus;  // per device: its CUDA device, -1 for a CPU replica
  caf::actor node_actor;           // for run_over_msg and abort_msg
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_msg& x) {
  return f(caf::meta::type_name("join_msg"), x.version, x.node, x.job_identity, x.data_fingerprint, x.devices,
           x.names, x.gpus, x.node_actor);
}
struct joined_msg {
  std::string refusal;  // empty: admitted
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, joined_msg& x) {
  return f(caf::meta::type_name("joined_msg"), x.refusal);
}
// The rendezvous store the coordinator serves (See Note [Rendezvous store]).
struct store_set_msg {
  std::string key;
  std::vector<char> value;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_set_msg& x) {
  return f(caf::meta::type_name("store_set_msg"), x.key, x.value);
}
// Answered with store_value_msg once the key is set, or not found after
// `wait_ms` (See Note [Held store reads]).
struct store_get_msg {
  std::string key;
  std::int32_t wait_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_get_msg& x) {
  return f(caf::meta::type_name("store_get_msg"), x.key, x.wait_ms);
}
struct store_value_msg {
  bool found = false;
  std::vector<char> value;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_value_msg& x) {
  return f(caf::meta::type_name("store_value_msg"), x.found, x.value);
}
// coordinator -> worker node: abort the collective groups of a generation
// (its members are blocked in a call and read no messages).
struct abort_msg {
  std::int64_t generation = 0;
  std::string why;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_msg& x) {
  return f(caf::meta::type_name("abort_msg"), x.generation, x.why);
}
// coordinator -> worker node: the run is over; the node ends its devices and
// exits (an empty error: the run finished).
struct run_over_msg {
  std::string error;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_over_msg& x) {
  return f(caf::meta::type_name("run_over_msg"), x.error);
}

}  // namespace dpactor
