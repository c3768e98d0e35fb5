#include "actors/worker.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "actors/async_device.hpp"
#include "actors/async_messages.hpp"
#include "actors/backend.hpp"
#include "actors/coordinator_store.hpp"
#include "actors/device.hpp"
#include "actors/launch.hpp"
#include "actors/network.hpp"
#include "actors/tls.hpp"
#include "config/config_file.hpp"
#include "config/job_identity.hpp"
#include <dpactor/error.hpp>
#include "tensors/gemm.hpp"
#include "actors/log.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;

// No coordinator answered at the address within the connect timeout.
struct unreachable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The Gloo groups this node's devices made, by generation, for abort_msg.
class group_registry {
 public:
  void add(std::int64_t generation, const std::shared_ptr<collective_group>& g) {
    std::lock_guard lock(mutex_);
    groups_[generation].push_back(g);
    // Older generations are over: forget them.
    while (!groups_.empty() && groups_.begin()->first < generation - 1) groups_.erase(groups_.begin());
  }
  void abort(std::optional<std::int64_t> generation) {
    std::lock_guard lock(mutex_);
    for (auto& [g, list] : groups_)
      if (!generation || g == *generation)
        for (auto& weak : list)
          if (auto group = weak.lock()) group->abort();
  }

 private:
  std::mutex mutex_;
  std::map<std::int64_t, std::vector<std::weak_ptr<collective_group>>> groups_;
};

struct node_outcome {
  std::promise<worker_result> promise;
  std::once_flag once;
  void set(worker_result r) {
    std::call_once(once, [&] { promise.set_value(std::move(r)); });
  }
};

// The node actor: takes the coordinator's abort_msg and run_over_msg, and
// notices its loss (See Note [A worker never trains alone]).
caf::behavior node_behavior(caf::event_based_actor* self, caf::actor coordinator,
                            std::shared_ptr<group_registry> groups, std::shared_ptr<node_outcome> outcome) {
  self->monitor(coordinator);
  self->set_down_handler([groups, outcome](const caf::down_msg& msg) {
    groups->abort(std::nullopt);
    outcome->set({worker_result::kind::fenced, "lost the coordinator (" + caf::to_string(msg.reason) + ")"});
  });
  return {
      [groups](const abort_msg& msg) { groups->abort(msg.generation); },
      [outcome](const run_over_msg& msg) {
        if (msg.error.empty()) outcome->set({worker_result::kind::finished, ""});
        else outcome->set({worker_result::kind::failed, msg.error});
      },
  };
}

// Whether a request's error means the coordinator is gone or silent (else
// it answered no).
bool is_lost(const caf::error& e) {
  return e == caf::sec::request_timeout || e == caf::sec::request_receiver_down;
}

std::string default_node_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(::getpid());
}

// Joins with this node's devices and serves them until the run is over;
// every actor handle it made is gone when it returns.
// `rejoining`: this worker served this coordinator's address before, so a
// connection closed during the handshake is a coordinator that is going or
// coming (a killed one's socket, a restarted one not serving yet), not one of
// another kind: it is retried like an unreachable one until connect_timeout.
worker_result serve(caf::actor_system& system, const worker_options& options, bool tls, bool rejoining = false) {
  const std::string node = options.node.empty() ? default_node_name() : options.node;
  // Connect and ask for the job, with retries until connect_timeout: the
  // coordinator may still be starting, and after a coordinator's loss CAF
  // may hand out its cached handle once more before it learns of the loss
  // (the hello to it then gets no answer: try again).
  caf::actor coordinator;
  std::string text;
  const auto give_up = clock_type::now() + options.connect_timeout;
  const auto hello_timeout = std::min<std::chrono::milliseconds>(
      options.connect_timeout, std::max<std::chrono::milliseconds>(options.connection_timeout, std::chrono::seconds(1)));
  for (;;) {
    std::string why;
    auto found = tls ? caf::openssl::remote_actor<caf::actor>(system, options.host, options.port)
                     : caf::io::remote_actor<caf::actor>(system, options.host, options.port);
    if (found) {
      std::string refusal;
      caf::scoped_actor self{system};
      self->request(*found, hello_timeout, hello_msg{options.version, node})
          .receive([&](const job_msg& job) { text = job.config; },
                   [&](const caf::error& e) { (is_lost(e) ? why : refusal) = system.render(e); });
      if (!refusal.empty()) return {worker_result::kind::refused, refusal};
      if (why.empty()) {
        coordinator = std::move(*found);
        break;
      }
    } else {
      why = system.render(found.error());
      // A TLS refusal (either way) is an answer: no retry changes it.
      if (std::string refused = take_last_tls_refusal(); !refused.empty()) return {worker_result::kind::refused, refused};
      if (!tls && found.error() == caf::sec::disconnect_during_handshake) {
        const std::string closed = "the coordinator at " + options.host + ":" + std::to_string(options.port) +
                                   " closed the connection during the handshake";
        if (!rejoining)
          return {worker_result::kind::refused,
                  closed + ": it may require TLS (cluster.tls.*) or run another version of dpactor"};
        why = closed;
      }
    }
    if (clock_type::now() >= give_up)
      throw unreachable("cannot reach the coordinator at " + options.host + ":" + std::to_string(options.port) + ": " +
                        why);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string facing = facing_address(options.host, options.port);

  job_config config;
  {
    std::vector<std::string> sets = options.sets;
    if (options.cpus) sets.push_back("cluster.cpus=" + std::to_string(*options.cpus));
    config = parse_job_config(text, "the coordinator's config", sets);
  }
  // What is the coordinator's alone: checkpoints, faults, the member floor.
  config.train.checkpoint_dir.clear();
  config.faults.inject.clear();
  config.cluster.min_devices = 1;
  // The job's kind is the coordinator's; the devices are this machine's.
  const bool gpu_job = !config.cluster.gpus.empty();
  if (gpu_job && options.gpus.empty())
    throw config_error("the job trains on GPUs (the coordinator's cluster.gpus) and this worker has none it can use (" +
                       options.gpu_note + "); join from a machine with GPUs, or run the job on CPU replicas");
  config.cluster.gpus = gpu_job ? options.gpus : std::vector<int>{};
  check_gpus_across_processes(config.cluster.gpus, "--join with --gpus");
  const int replicas = gpu_job                   ? static_cast<int>(config.cluster.gpus.size())
                       : config.cluster.cpus > 0 ? static_cast<int>(config.cluster.cpus)
                                                 : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const launch_plan plan = prepare_launch(config, run_options{}, replicas);
  if (plan.rounds && config.sync.mode != sync_mode::async && config.train.reproducible)
    plan.rounds->history->keep(round_history_bytes);
  set_blas_threads(plan.blas_threads);

  auto groups = std::make_shared<group_registry>();
  auto outcome = std::make_shared<node_outcome>();
  auto result = outcome->promise.get_future();
  const auto store = std::make_shared<coordinator_store>(system, coordinator);
  const cluster_link link{store, facing,
                          config.cluster.shared_memory, rendezvous_timeout(config)};
  const caf::actor node_actor = system.spawn(node_behavior, coordinator, groups, outcome);

  join_msg join;
  join.version = options.version;
  join.node = node;
  join.job_identity = job_identity(config);
  join.data_fingerprint = data_fingerprint(*plan.data.train, *plan.data.test);
  join.node_actor = node_actor;
  std::vector<caf::actor_addr> devices;
  for (int id = 0; id < replicas; ++id) {
    auto setup = make_device_setup(config, plan, id);
    setup->name = node + "/" + setup->name;
    setup->trained_to_reducer = config.train.record_trained;
    // sync.mode = "async": a device that runs the rounds the reducer hands
    // it, each with its worker's state (See Note [Async rounds across
    // processes]); it joins as a device handle, whose interface it does not
    // have: the coordinator hands it to the async reducer untyped.
    if (config.sync.mode == sync_mode::async) {
      join.names.push_back(setup->name);
      join.gpus.push_back(-1);
      auto watch = std::make_shared<async_device_watch>();
      const caf::actor device = system.spawn<caf::detached>(async_device, std::move(setup), caf::actor{}, watch);
      join.devices.push_back(caf::actor_cast<device_actor>(device));
      devices.push_back(device.address());
      devices.push_back(system.spawn(async_progress_relay, device, std::move(watch)).address());
      continue;
    }
    const int gpu = gpu_job ? config.cluster.gpus.at(static_cast<std::size_t>(id)) : -1;
    setup->remote_group = [link, groups, gpu](const group_ticket& ticket, int size) {
      auto group = group_from_ticket(ticket, link, size, [gpu](int) { return gpu; });
      groups->add(ticket.generation, group);
      return group;
    };
    join.names.push_back(setup->name);
    join.gpus.push_back(gpu);
    join.devices.push_back(system.spawn<caf::detached>(device_behavior, std::move(setup)));
    devices.push_back(join.devices.back().address());
  }
  std::string refusal;
  bool lost = false;
  {
    caf::scoped_actor self{system};
    self->request(coordinator, options.connect_timeout, join)
        .receive([&](const joined_msg& j) { refusal = j.refusal; },
                 [&](const caf::error& e) { refusal = system.render(e); lost = is_lost(e); });
  }
  worker_result r;
  if (lost) {
    r = {worker_result::kind::fenced, "no answer from the coordinator while joining (" + refusal + ")"};
  } else if (!refusal.empty()) {
    r = {worker_result::kind::refused, refusal};
  } else {
    engine_log()->info("joined {}:{} as {} with {} device{}", options.host, options.port, node, replicas, replicas == 1 ? "" : "s");
    r = result.get();
  }
  groups->abort(std::nullopt);
  for (const auto& d : devices) caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(node_actor, caf::exit_reason::user_shutdown);
  store->close();
  return r;
}

}  // namespace

worker_result run_worker(const worker_options& options) {
  const bool tls = tls_enabled(options.tls, options.host);
  if (tls)
    check_tls_files(options.tls, options.tls.mode == tls_mode::on
                                     ? "cluster.tls.mode = \"on\""
                                     : "the coordinator at " + options.host +
                                           " is not a loopback address, so TLS is on (cluster.tls.mode = \"auto\")");
  auto cfg = make_network_config(options.heartbeat, options.connection_timeout);
  if (tls) use_tls(*cfg, options.tls);
  auto system = std::make_unique<caf::actor_system>(*cfg);
  // Devices the coordinator still knows (a refused join, while it runs on)
  // stay referenced by the connection to it, which CAF closes only when the
  // system goes down, and ~actor_system would wait for them forever: past a
  // bound the system is left running to the process's end (so is a network
  // layer that cannot close a connection, See Note [A lost peer can hold the
  // network layer's shutdown]). True if it ended.
  auto shut_down = [&] {
    const auto bound = clock_type::now() + std::chrono::seconds(2);
    while (system->registry().running() > 0 && clock_type::now() < bound)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (system->registry().running() > 0) {
      (void)system.release();
      (void)cfg.release();
      return false;
    }
    return destroy_within(std::move(system), std::move(cfg), std::chrono::seconds(5));
  };
  worker_result r;
  try {
    r = serve(*system, options, tls);
    // Fenced with --rejoin-timeout: join again (a restarted coordinator, or
    // the one that removed this worker), trying for up to rejoin_timeout.
    while (r.outcome == worker_result::kind::fenced && options.rejoin_timeout.count() > 0) {
      if (options.on_rejoin) options.on_rejoin(r.message);
      worker_options again = options;
      again.connect_timeout = options.rejoin_timeout;
      try {
        r = serve(*system, again, tls, /*rejoining=*/true);
      } catch (const unreachable& e) {
        r = {worker_result::kind::fenced, r.message + "; then " + e.what() + " (--rejoin-timeout)"};
        break;
      }
    }
  } catch (...) {
    shut_down();
    throw;
  }
  r.left_system_running = !shut_down();
  return r;
}

}  // namespace dpactor
