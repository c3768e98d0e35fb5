#include "actors/coordinator.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/tls.hpp"
#include "comms/gloo.hpp"
#if DPACTOR_HAS_CUDA
#include "comms/nccl.hpp"
#endif
#include "config/config_file.hpp"
#include "config/job_identity.hpp"
#include "tensors/error.hpp"

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
          spdlog::info("node {} joined with {} device{}", msg.node, msg.devices.size(), msg.devices.size() == 1 ? "" : "s");
        else
          spdlog::warn("refused node {}: {}", msg.node, refusal);
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

bool worker_nodes::add(const caf::actor& node) {
  std::lock_guard lock(mutex_);
  if (closed_) return false;
  nodes_.push_back(node);
  return true;
}

std::vector<caf::actor> worker_nodes::list() const {
  std::lock_guard lock(mutex_);
  return nodes_;
}

std::vector<caf::actor> worker_nodes::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  return nodes_;
}

namespace {

// The joins: counted before training starts, passed to the reducer after.
struct join_book {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<join_msg> joins;       // before the start
  int devices = 0;
  bool started = false;
  reducer_actor reducer;             // once attached
  std::vector<node_joined_msg> early;  // after the start, before the reducer was attached
};

node_joined_msg joined_devices(const join_msg& j) { return {j.devices, j.names}; }

}  // namespace

coordinator_start start_coordinator(caf::actor_system& system, const coordinator_options& options,
                                    const job_config& config, const std::string& fingerprint, int local_devices,
                                    int first_id, const std::atomic<bool>& stop) {
  coordinator_start out;
  out.store = make_memory_store();
  out.nodes = std::make_shared<worker_nodes>();
  auto book = std::make_shared<join_book>();
  coordinator_setup setup;
  setup.version = options.version;
  setup.config_text = dump_job_config(config);
  setup.store = out.store;
  setup.on_join = [book, nodes = out.nodes, identity = job_identity(config), fingerprint,
                   gpu_job = !config.cluster.gpus.empty()](const join_msg& msg) -> std::string {
    if (const std::string d = first_difference(identity, msg.job_identity, "coordinator", "worker"); !d.empty())
      return "its config differs: " + d;
    if (const std::string d = kind_difference(gpu_job, msg); !d.empty()) return d;
    if (msg.data_fingerprint != fingerprint)
      return "its data differs: the coordinator has " + fingerprint + "; the worker has " + msg.data_fingerprint;
    std::lock_guard lock(book->mutex);
    if (!book->started) {
      book->joins.push_back(msg);
      book->devices += static_cast<int>(msg.devices.size());
      book->changed.notify_all();
      return "";
    }
    if (!nodes->add(msg.node_actor)) return "the run is over";
    if (book->reducer) caf::anon_send(book->reducer, joined_devices(msg));
    else book->early.push_back(joined_devices(msg));
    return "";
  };
  out.attach_reducer = [book](const reducer_actor& reducer) {
    std::lock_guard lock(book->mutex);
    book->reducer = reducer;
    for (auto& j : book->early) caf::anon_send(reducer, std::move(j));
    book->early.clear();
  };
  out.actor = system.spawn(coordinator_behavior, std::move(setup));
  const bool tls = tls_enabled(config.cluster.tls, options.host);
  auto port = tls ? caf::openssl::publish(out.actor, options.port, options.host.c_str(), true)
                  : caf::io::publish(out.actor, options.port, options.host.c_str(), true);
  if (!port) {
    caf::anon_send_exit(out.actor, caf::exit_reason::user_shutdown);
    throw config_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " +
                       system.render(port.error()));
  }
  if (options.on_listening) options.on_listening(options.host + ":" + std::to_string(*port));
  if (tls) spdlog::info("mutual TLS on the control plane (cluster.tls.*); Gloo's traffic is not encrypted");
  std::unique_lock lock(book->mutex);
  while (local_devices + book->devices < options.wait_devices ||
         static_cast<int>(book->joins.size()) < options.wait_workers) {
    if (stop) {
      caf::anon_send_exit(out.actor, caf::exit_reason::user_shutdown);
      throw training_error(
          "stopped while waiting for workers: " +
          (options.wait_workers > 0 ? std::to_string(book->joins.size()) + " of " + std::to_string(options.wait_workers) +
                                          " worker processes (the launcher's world size) and "
                                    : std::string()) +
          std::to_string(local_devices + book->devices) + " of " + std::to_string(options.wait_devices) +
          " devices (--wait-devices) had joined");
    }
    book->changed.wait_for(lock, std::chrono::milliseconds(100));
  }
  book->started = true;
  int id = first_id;
  for (const join_msg& j : book->joins) {
    for (std::size_t d = 0; d < j.devices.size(); ++d)
      out.members.push_back(member_handle{j.devices[d], id++, j.names[d], std::make_shared<device_control>()});
    out.nodes->add(j.node_actor);
  }
  return out;
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

group_ticket nccl_ticket(const std::shared_ptr<rendezvous_store>& store, const std::vector<int>& gpus,
                         const std::vector<int>& ids, std::int64_t generation) {
#if DPACTOR_HAS_CUDA
  group_ticket ticket{"nccl", generation, "g" + std::to_string(generation), nullptr};
  if (generation >= 2) store->erase_prefix("g" + std::to_string(generation - 2) + "/");
  nccl_group_options o;
  o.prefix = ticket.rendezvous_id;
  // Only the coordinator's own ranks ask: their ids index its cluster.gpus.
  ticket.local = make_nccl_group(store, static_cast<int>(ids.size()), [gpus, ids](int rank) {
    return gpus.at(static_cast<std::size_t>(ids.at(static_cast<std::size_t>(rank))));
  }, o);
  return ticket;
#else
  (void)store;
  (void)gpus;
  (void)ids;
  (void)generation;
  throw config_error("cluster.gpus is set but this build of dpactor has no CUDA support");
#endif
}

group_ticket gloo_ticket(const std::shared_ptr<rendezvous_store>& store, const std::string& address,
                         bool shared_memory, int size, std::int64_t generation) {
  group_ticket ticket{"gloo", generation, "g" + std::to_string(generation), nullptr};
  // Two generations back are over everywhere: their keys can go.
  if (generation >= 2) store->erase_prefix("g" + std::to_string(generation - 2) + "/");
  gloo_group_options o;
  o.prefix = ticket.rendezvous_id;
  o.address = address;
  o.shared_memory = shared_memory;
  ticket.local = make_gloo_group(store, size, o);
  return ticket;
}

}  // namespace dpactor
