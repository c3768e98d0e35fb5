#include "actors/coordinator.hpp"
#include "actors/log.hpp"


namespace dpactor {

caf::behavior coordinator_behavior(caf::event_based_actor* /*self*/, coordinator_setup setup) {
  auto st = std::make_shared<coordinator_setup>(std::move(setup));
  return {
      [st](const hello_msg& msg) -> caf::result<job_msg> {
        if (msg.version != st->version)
          return caf::make_error(caf::sec::runtime_error, "refused: the worker runs dpactor " + msg.version +
                                                              ", the coordinator " + st->version);
        return job_msg{st->config_text};
      },
      [st](const join_msg& msg) -> joined_msg {
        std::string refusal;
        if (msg.version != st->version)
          refusal = "the worker runs dpactor " + msg.version + ", the coordinator " + st->version;
        else if (msg.devices.size() != msg.names.size() || msg.devices.empty())
          refusal = "a join must name each of its devices";
        else
          refusal = st->on_join(msg);
        if (refusal.empty())
          engine_log()->info("node {} joined with {} device{}", msg.node, msg.devices.size(), msg.devices.size() == 1 ? "" : "s");
        else
          engine_log()->warn("refused node {}: {}", msg.node, refusal);
        return joined_msg{refusal};
      },
      [st](const store_set_msg& msg) { st->store->set(msg.key, msg.value); },
      [st](const store_get_msg& msg) {
        store_value_msg reply;
        if (auto value = st->store->get(msg.key, rendezvous_store::clock::now())) {
          reply.found = true;
          reply.value = std::move(*value);
        }
        return reply;
      },
  };
}

// One collective backend serves a generation: its members are all GPU
// replicas (NCCL) or all CPU replicas (Gloo).
std::string kind_difference(bool gpu_job, const join_msg& msg) {
  if (msg.gpus.size() != msg.devices.size()) return "a join must give each device's kind";
  for (std::size_t d = 0; d < msg.gpus.size(); ++d)
    if ((msg.gpus[d] >= 0) != gpu_job)
      return "its device " + msg.names[d] + " is a " + (gpu_job ? "CPU replica" : "GPU") + " and the job's are " +
             (gpu_job ? "GPUs" : "CPU replicas") + ": every member of a job is of one kind";
  return "";
}

}  // namespace dpactor
