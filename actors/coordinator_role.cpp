#include "actors/coordinator_role.hpp"

#include <condition_variable>
#include <mutex>

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "actors/backend.hpp"
#include "actors/coordinator.hpp"
#include "actors/coordinator_store.hpp"
#include "actors/network.hpp"
#include "actors/tls.hpp"
#include "config/config_file.hpp"
#include "config/job_identity.hpp"
#include <dpactor/error.hpp>
#include "actors/log.hpp"

namespace dpactor {
namespace {

// Shard messages queued ahead at each device when some devices are in other
// processes, at most, and the work they hold (See Note [Work queued ahead
// across processes]): 32 messages of about 2 ms each.
constexpr std::int64_t remote_prefetch = 32;
constexpr double remote_work_ahead_s = 0.064;

// The workers' node actors, for abort_msg and run_over_msg: those joined
// before the start, then those joined during training. Closed when the run
// is over; a join after that is refused. Thread-safe.
class worker_nodes {
 public:
  // False once closed.
  bool add(const caf::actor& node) {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    nodes_.push_back(node);
    return true;
  }
  std::vector<caf::actor> list() const {
    std::lock_guard lock(mutex_);
    return nodes_;
  }
  // Closes the list and returns it.
  std::vector<caf::actor> close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    return nodes_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<caf::actor> nodes_;
  bool closed_ = false;
};

// The joins: counted before training starts, passed to the reducer after.
struct join_book {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<join_msg> joins;  // before the start
  int devices = 0;
  bool started = false;
  reducer_actor reducer;               // once attached
  caf::actor async_reducer;            // sync.mode = "async", once attached
  std::vector<node_joined_msg> early;  // after the start, before the reducer was attached
};

node_joined_msg joined_devices(const join_msg& j) { return {j.devices, j.names}; }

}  // namespace

struct coordinator_role::state {
  caf::actor actor;
  std::shared_ptr<store_watch> watch = std::make_shared<store_watch>();
  std::shared_ptr<rendezvous_store> store =  // the Gloo groups'
      make_memory_store([watch = watch](const std::string& key) { watch->changed(key); });
  std::string address;  // where the coordinator's own ranks listen
  bool shared_memory = true;
  std::chrono::milliseconds rendezvous_timeout{10'000};
  std::vector<int> gpus;
  std::vector<member_handle> members;
  std::shared_ptr<worker_nodes> nodes = std::make_shared<worker_nodes>();
  std::shared_ptr<join_book> book = std::make_shared<join_book>();
};

std::unique_ptr<caf::actor_system_config> coordinator_role::system_config(const job_config& config,
                                                                          const coordinator_options& options) {
  auto cfg = make_network_config(std::chrono::milliseconds(config.cluster.heartbeat_ms),
                                 std::chrono::milliseconds(config.cluster.connection_timeout_ms));
  if (const std::string& host = options.host; tls_enabled(config.cluster.tls, host)) {
    check_tls_files(config.cluster.tls, config.cluster.tls.mode == tls_mode::on
                                            ? "cluster.tls.mode = \"on\""
                                            : "the coordinator listens on " + host +
                                                  ", not a loopback address, so TLS is on (cluster.tls.mode = \"auto\")");
    use_tls(*cfg, config.cluster.tls);
  }
  return cfg;
}

coordinator_role::coordinator_role(caf::actor_system& system, const coordinator_options& options,
                                   const job_config& config, const launch_plan& plan, const std::atomic<bool>& stop)
    : state_(std::make_unique<state>()) {
  auto& st = *state_;
  st.address = options.host;
  st.shared_memory = config.cluster.shared_memory;
  st.rendezvous_timeout = rendezvous_timeout(config);
  check_gpus_across_processes(config.cluster.gpus, "--coordinator with cluster.gpus");
  st.gpus = config.cluster.gpus;
  const int local_devices = plan.replicas;
  auto book = st.book;
  coordinator_setup setup;
  setup.version = options.version;
  // The round modes' logical workers are counted once, here (sync.workers =
  // 0: the devices the run starts with, which a worker cannot know): the
  // workers get the number in the config, and it is part of the job's
  // identity.
  job_config resolved = config;
  if (plan.rounds) resolved.sync.workers = plan.shape.workers;
  setup.config_text = dump_job_config(resolved);
  setup.store = st.store;
  // Joins during training are taken in every mode: a round mode's logical
  // workers move to a newcomer with their states (Note [Moving logical
  // workers]); async's travel with each round (Note [Async rounds across
  // processes]).
  setup.on_join = [book, nodes = st.nodes, identity = job_identity(resolved),
                   fingerprint = data_fingerprint(*plan.data.train, *plan.data.test),
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
    if (book->async_reducer) caf::anon_send(book->async_reducer, joined_devices(msg));
    else if (book->reducer) caf::anon_send(book->reducer, joined_devices(msg));
    else book->early.push_back(joined_devices(msg));
    return "";
  };
  st.actor = system.spawn(coordinator_behavior, std::move(setup));
  st.watch->attach(st.actor);
  const bool tls = tls_enabled(config.cluster.tls, options.host);
  auto port = tls ? caf::openssl::publish(st.actor, options.port, options.host.c_str(), true)
                  : caf::io::publish(st.actor, options.port, options.host.c_str(), true);
  if (!port) {
    caf::anon_send_exit(st.actor, caf::exit_reason::user_shutdown);
    throw config_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " +
                       system.render(port.error()));
  }
  if (options.on_listening) options.on_listening(options.host + ":" + std::to_string(*port));
  if (tls) engine_log()->info("mutual TLS on the control plane (cluster.tls.*); Gloo's traffic is not encrypted");
  std::unique_lock lock(book->mutex);
  while (local_devices + book->devices < options.wait_devices ||
         static_cast<int>(book->joins.size()) < options.wait_workers) {
    if (stop) {
      caf::anon_send_exit(st.actor, caf::exit_reason::user_shutdown);
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
  int id = local_devices;
  for (const join_msg& j : book->joins) {
    for (std::size_t d = 0; d < j.devices.size(); ++d)
      st.members.push_back(member_handle{j.devices[d], id++, j.names[d], std::make_shared<device_control>()});
    st.nodes->add(j.node_actor);
  }
}

coordinator_role::~coordinator_role() = default;

const std::vector<member_handle>& coordinator_role::members() const noexcept { return state_->members; }

caf::actor coordinator_role::actor() const { return state_->actor; }

void coordinator_role::steer(loader_setup& loader, reducer_setup& reducer, const launch_plan& plan) const {
  const auto& st = *state_;
  reducer.make_group = cluster_groups(st.gpus, cluster_link{st.store, st.address, st.shared_memory, st.rendezvous_timeout});
  reducer.abort_remote = [nodes = st.nodes](std::int64_t generation, const std::string& why) {
    for (const auto& n : nodes->list()) caf::anon_send(n, abort_msg{generation, why});
  };
  for (const auto& f : plan.faults)
    if (is_device_fault(f)) reducer.remote_device_faults.push_back(f);
  // A cut lives in one process's memory.
  reducer.cuts = false;
  // Across processes every member computes its own range; shard sizes
  // still follow throughput.
  loader.steal_slices = false;
  loader.prefetch = std::max<std::int64_t>(loader.prefetch, remote_prefetch);
  loader.work_ahead_s = remote_work_ahead_s;
}

void coordinator_role::attach(const reducer_actor& reducer, const launch_plan& plan) {
  auto& st = *state_;
  for (const auto& h : st.members)
    for (const auto& f : plan.faults)
      if (is_device_fault(f) && f.device == h.id) caf::anon_send(h.actor, inject_msg{f.text});
  std::lock_guard lock(st.book->mutex);
  st.book->reducer = reducer;
  for (auto& j : st.book->early) caf::anon_send(reducer, std::move(j));
  st.book->early.clear();
}

void coordinator_role::attach_async(const caf::actor& reducer) {
  auto& st = *state_;
  node_joined_msg before;
  for (const member_handle& h : st.members) {
    before.devices.push_back(h.actor);
    before.names.push_back(h.name);
  }
  std::lock_guard lock(st.book->mutex);
  st.book->async_reducer = reducer;
  if (!before.devices.empty()) caf::anon_send(reducer, std::move(before));
  for (auto& j : st.book->early) caf::anon_send(reducer, std::move(j));
  st.book->early.clear();
}

void coordinator_role::end_run(const std::string& error) {
  for (const auto& node : state_->nodes->close()) caf::anon_send(node, run_over_msg{error});
}

}  // namespace dpactor
