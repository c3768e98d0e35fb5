#include "actors/coordinator.hpp"
#include "actors/log.hpp"

#include <map>


namespace dpactor {

namespace {

// The reads of keys not set yet, held until set or expired (Note [Held store
// reads]).
class held_reads {
 public:
  std::uint64_t hold(const std::string& key, caf::typed_response_promise<store_value_msg> promise) {
    const std::uint64_t serial = ++serial_;
    by_key_[key].emplace(serial, std::move(promise));
    key_of_.emplace(serial, key);
    return serial;
  }
  // Answers every read held for `key` with `value`.
  void answer(const std::string& key, const std::vector<char>& value) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return;
    for (auto& [serial, promise] : it->second) {
      promise.deliver(store_value_msg{true, value});
      key_of_.erase(serial);
    }
    by_key_.erase(it);
  }
  // Answers the read `serial`, if still held, with "not set".
  void expire(std::uint64_t serial) {
    auto k = key_of_.find(serial);
    if (k == key_of_.end()) return;
    auto it = by_key_.find(k->second);
    it->second.at(serial).deliver(store_value_msg{});
    it->second.erase(serial);
    if (it->second.empty()) by_key_.erase(it);
    key_of_.erase(k);
  }

 private:
  std::uint64_t serial_ = 0;
  std::map<std::string, std::map<std::uint64_t, caf::typed_response_promise<store_value_msg>>> by_key_;
  std::map<std::uint64_t, std::string> key_of_;
};

}  // namespace

caf::behavior coordinator_behavior(caf::event_based_actor* self, coordinator_setup setup) {
  auto st = std::make_shared<coordinator_setup>(std::move(setup));
  auto held = std::make_shared<held_reads>();
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
      [self, st, held](const store_get_msg& msg) -> caf::result<store_value_msg> {
        if (auto value = st->store->get(msg.key, rendezvous_store::clock::now()))
          return store_value_msg{true, std::move(*value)};
        if (msg.wait_ms <= 0) return store_value_msg{};
        auto promise = self->make_response_promise<store_value_msg>();
        const std::uint64_t serial = held->hold(msg.key, promise);
        self->delayed_send(self, std::chrono::milliseconds(msg.wait_ms), store_expire_atom::value, serial);
        return promise;
      },
      [st, held](store_changed_atom, const std::string& key) {
        if (auto value = st->store->get(key, rendezvous_store::clock::now())) held->answer(key, *value);
      },
      [held](store_expire_atom, std::uint64_t serial) { held->expire(serial); },
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
