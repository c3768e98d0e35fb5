#include "actors/coordinator_store.hpp"

#include <thread>

#include "actors/actor_interfaces.hpp"
#include "actors/protocol.hpp"

namespace dpactor {
namespace {

// A device thread's store read, answered through the promise: in-process
// only (a detached device cannot take a CAF reply in the middle of a handler).
struct store_fetch {
  std::string key;
  std::shared_ptr<std::promise<coordinator_store::answer>> reply;
};

}  // namespace
}  // namespace dpactor

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::store_fetch)

namespace dpactor {
namespace {

// How long a rank waits before it asks again when a read failed (the
// coordinator unreachable: the run's end is decided elsewhere).
constexpr std::chrono::milliseconds store_retry{10};

// Asks the coordinator on behalf of device threads.
caf::behavior store_proxy(caf::event_based_actor* self, caf::actor coordinator) {
  return {
      [self, coordinator](const store_fetch& f) {
        self->request(coordinator, store_hold + std::chrono::seconds(5),
                      store_get_msg{f.key, static_cast<std::int32_t>(store_hold.count())})
            .then([reply = f.reply](const store_value_msg& v) { reply->set_value({true, v}); },
                  [reply = f.reply](const caf::error&) { reply->set_value({}); });
      },
  };
}

}  // namespace

coordinator_store::coordinator_store(caf::actor_system& system, caf::actor coordinator)
    : coordinator_(std::move(coordinator)), proxy_(system.spawn(store_proxy, coordinator_)) {}

void coordinator_store::set(const std::string& key, const std::vector<char>& value) {
  caf::anon_send(coordinator_, store_set_msg{key, value});
}

std::optional<std::vector<char>> coordinator_store::get(const std::string& key, clock::time_point until) {
  for (;;) {
    std::shared_future<answer> reply = in_flight(key);
    if (reply.wait_until(until) != std::future_status::ready) return std::nullopt;  // the next get waits for it
    answered(key);
    const answer& a = reply.get();
    if (a.value.found) return a.value.value;
    if (!a.delivered) std::this_thread::sleep_until(std::min(until, clock::now() + store_retry));
    if (clock::now() >= until) return std::nullopt;
  }
}

void coordinator_store::prefetch(const std::vector<std::string>& keys) {
  for (const auto& key : keys) in_flight(key);
}

void coordinator_store::close() { caf::anon_send_exit(proxy_, caf::exit_reason::user_shutdown); }

std::shared_future<coordinator_store::answer> coordinator_store::in_flight(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = reads_.find(key);
  if (it == reads_.end()) {
    auto reply = std::make_shared<std::promise<answer>>();
    it = reads_.emplace(key, reply->get_future().share()).first;
    caf::anon_send(proxy_, store_fetch{key, std::move(reply)});
  }
  return it->second;
}

void coordinator_store::answered(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = reads_.find(key);
  if (it != reads_.end() && it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready) reads_.erase(it);
}

void store_watch::attach(caf::actor coordinator) {
  std::lock_guard lock(mutex_);
  coordinator_ = std::move(coordinator);
}

void store_watch::changed(const std::string& key) {
  std::lock_guard lock(mutex_);
  if (coordinator_) caf::anon_send(coordinator_, store_changed_atom::value, key);
}

}  // namespace dpactor
