#include "actors/simulated_run.hpp"

#include <atomic>
#include <ctime>
#include <future>
#include <pthread.h>

#include <caf/all.hpp>

#include "actors/launch.hpp"
#include "actors/loader.hpp"
#include "actors/reducer.hpp"
#include "actors/run_control.hpp"
#include "actors/simulated_device.hpp"
#include <dpactor/error.hpp>

namespace dpactor {
namespace {

// The CPU clock of the thread that calls it.
clockid_t this_thread_clock() {
  clockid_t id{};
  pthread_getcpuclockid(pthread_self(), &id);
  return id;
}

double cpu_seconds(clockid_t id) {
  timespec ts{};
  if (clock_gettime(id, &ts) != 0) return 0.0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void check_simulable(const job_config& config) {
  const std::string where = config.source.empty() ? "run_simulated" : config.source;
  if (!config.train.checkpoint_dir.empty())
    throw config_error(where + ": train.checkpoint_dir: simulated members hold no state to checkpoint");
  if (config.train.mode != train_mode::epochs)
    throw config_error(where + ": train.mode: simulated members train epochs of indices only");
  if (config.sync.rounds())
    throw config_error(where + ": sync.mode: simulated members run every_step only");
  for (const auto& f : parse_fault_specs(config.faults.inject))
    if (f.kind != fault_kind::fail && f.kind != fault_kind::hang && f.kind != fault_kind::slow &&
        f.kind != fault_kind::join && f.kind != fault_kind::leave)
      throw config_error(where + ": faults.inject: \"" + f.text + "\": simulated members take fail, hang, slow, join "
                         "and leave only");
}

}  // namespace

simulated_run_result run_simulated(const job_config& config, const simulated_run_options& options,
                                   std::vector<event_callback> callbacks) {
  validate_job_config(config);
  check_simulable(config);
  if (options.members < 1) throw config_error("run_simulated: members = " + std::to_string(options.members));
  const auto started = std::chrono::steady_clock::now();

  launch_plan plan;
  plan.data.train = std::make_shared<const dataset>("simulated", options.train_rows, 1, 10);
  plan.data.test = std::make_shared<const dataset>("simulated test", options.test_rows, 1, 10);
  plan.replicas = options.members;
  plan.faults = parse_fault_specs(config.faults.inject);
  const auto rows = static_cast<std::int64_t>(options.train_rows);
  plan.epoch_steps = std::max<std::int64_t>(1, (rows + config.train.batch_size - 1) / config.train.batch_size);
  plan.run_steps = plan.epoch_steps * config.train.epochs;
  if (config.train.max_steps > 0) plan.run_steps = std::min(plan.run_steps, config.train.max_steps);
  plan.schedule = make_lr_schedule(config, plan.run_steps);

  auto control = std::make_shared<run_control>(std::move(callbacks));
  std::future<run_summary> outcome = control->outcome();
  auto cfg = make_system_config();
  auto system = std::make_unique<caf::actor_system>(*cfg);

  const auto spawn_member = [&config, &plan, &options, control, sys = system.get()](int id) {
    auto setup = std::make_shared<simulated_device_setup>();
    setup->id = id;
    setup->name = "sim:" + std::to_string(id);
    setup->compute = options.compute;
    setup->exchange = options.exchange;
    for (const auto& f : plan.faults)
      if (is_device_fault(f) && f.device == id) setup->faults.push_back(f);
    if (config.train.record_trained) setup->on_trained = [control](const trained_event& e) { control->emit(e); };
    member_handle h{{}, id, setup->name, setup->control};
    h.actor = sys->spawn(simulated_device_behavior, std::move(setup));
    return h;
  };
  std::vector<member_handle> members;
  for (int id = 0; id < options.members; ++id) members.push_back(spawn_member(id));

  // The reducer's and the loader's threads tell their CPU clocks as they start.
  std::promise<clockid_t> reducer_clock, loader_clock;
  auto reducer_clock_id = reducer_clock.get_future(), loader_clock_id = loader_clock.get_future();
  loader_actor loader = system->spawn<caf::detached>(
      [&loader_clock](loader_actor::stateful_pointer<loader_state> self, loader_setup ls) {
        loader_clock.set_value(this_thread_clock());
        return loader_behavior(self, std::move(ls));
      },
      make_loader_setup(config, plan));
  reducer_setup rs = make_reducer_setup(config, plan);
  rs.make_group = [](const std::vector<int>& ids, std::int64_t generation) {
    group_ticket t;
    t.backend = "simulated";
    t.generation = generation;
    t.local = std::make_shared<simulated_group>(static_cast<int>(ids.size()));
    return t;
  };
  rs.control = control;
  rs.devices = members;
  rs.spawn_device = spawn_member;
  rs.loader = loader;
  rs.started = started;
  reducer_actor reducer = system->spawn<caf::detached>(
      [&reducer_clock](reducer_ptr self, reducer_setup setup) {
        reducer_clock.set_value(this_thread_clock());
        return reducer_behavior(self, std::move(setup));
      },
      std::move(rs));
  caf::logger::set_current_actor_system(nullptr);
  caf::anon_send(reducer, start_atom::value);
  // A detached actor starts its behavior with its first message.
  const clockid_t reducer_cpu = reducer_clock_id.get(), loader_cpu = loader_clock_id.get();

  simulated_run_result result;
  std::exception_ptr failure;
  if (outcome.wait_for(options.timeout) != std::future_status::ready) {
    failure = std::make_exception_ptr(error(error_kind::timeout, "run_simulated: no end within " +
                                                                     std::to_string(options.timeout.count()) + " s"));
  } else {
    try {
      result.summary = outcome.get();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Read while both threads live: the actors end below.
  result.reducer_cpu_s = cpu_seconds(reducer_cpu);
  result.loader_cpu_s = cpu_seconds(loader_cpu);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  caf::anon_send_exit(reducer, caf::exit_reason::user_shutdown);  // takes every member along
  caf::anon_send_exit(loader, caf::exit_reason::user_shutdown);
  for (const auto& m : members) caf::anon_send_exit(m.actor, caf::exit_reason::user_shutdown);
  system->await_all_actors_done();
  // A detached actor's thread ends once nothing refers to the actor.
  reducer = reducer_actor{};
  loader = loader_actor{};
  members.clear();
  if (!destroy_within(std::move(system), std::move(cfg), std::chrono::seconds(10)) && !failure)
    failure = std::make_exception_ptr(error(error_kind::internal, "run_simulated: the actor system did not stop"));
  if (failure) std::rethrow_exception(failure);
  return result;
}

}  // namespace dpactor
