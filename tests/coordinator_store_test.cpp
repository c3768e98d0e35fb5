// The coordinator's rendezvous store across processes (Note [Held store
// reads]): a worker's read of a key not set is held by the coordinator until
// the key is set, a read the coordinator answers slowly is waited for and
// not sent again, and a key never set is asked for about once a hold, not
// every few milliseconds. The coordinator and the worker's store are the
// real ones; a relay actor between them counts the reads (and slows them).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include <caf/all.hpp>

#include "actors/coordinator.hpp"
#include "actors/coordinator_store.hpp"
#include "actors/protocol.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Passes reads and writes to `coordinator`, counting the reads and holding
// each for `delay` first (a detached actor: one read after the other, as a
// busy coordinator answers them).
caf::behavior counting_relay(caf::event_based_actor* self, caf::actor coordinator, std::shared_ptr<std::atomic<int>> reads,
                             std::chrono::milliseconds delay) {
  return {
      [=](const store_get_msg& msg) -> caf::result<store_value_msg> {
        ++*reads;
        std::this_thread::sleep_for(delay);
        auto promise = self->make_response_promise<store_value_msg>();
        self->request(coordinator, caf::infinite, msg).then([promise](const store_value_msg& v) mutable {
          promise.deliver(v);
        });
        return promise;
      },
      [=](const store_set_msg& msg) { self->send(coordinator, msg); },
  };
}

struct served_store {
  explicit served_store(std::chrono::milliseconds delay = 0ms) : system(config()) {
    local = make_memory_store([w = watch](const std::string& key) { w->changed(key); });
    coordinator_setup setup;
    setup.store = local;
    coordinator = system.spawn(coordinator_behavior, std::move(setup));
    watch->attach(coordinator);
    relay = system.spawn<caf::detached>(counting_relay, coordinator, reads, delay);
    worker = std::make_shared<coordinator_store>(system, relay);
  }
  ~served_store() {
    worker->close();
    caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  }
  static caf::actor_system_config& config() {
    static caf::actor_system_config cfg = [] {
      caf::actor_system_config c;
      register_message_types(c);
      return c;
    }();
    return cfg;
  }
  // As a Gloo rank reads: one slice after the other until the deadline.
  std::optional<std::vector<char>> read(const std::string& key, clock_type::duration within) {
    const auto deadline = clock_type::now() + within;
    while (clock_type::now() < deadline)
      if (auto v = worker->get(key, std::min(deadline, clock_type::now() + store_poll_slice))) return v;
    return std::nullopt;
  }

  caf::actor_system system;
  std::shared_ptr<store_watch> watch = std::make_shared<store_watch>();
  std::shared_ptr<rendezvous_store> local;
  caf::actor coordinator;
  std::shared_ptr<std::atomic<int>> reads = std::make_shared<std::atomic<int>>(0);
  caf::actor relay;
  std::shared_ptr<coordinator_store> worker;
};

const std::vector<char> value{'a', 'b', 'c'};

TEST(CoordinatorStore, ASlowCoordinatorIsWaitedForNotAskedAgain) {
  served_store s(40ms);  // four slices a read
  s.local->set("g1/rank0", value);
  EXPECT_EQ(s.read("g1/rank0", 10s), value);
  EXPECT_EQ(s.reads->load(), 1);
}

TEST(CoordinatorStore, AReadOfAKeyNotSetIsHeldUntilTheCoordinatorsOwnRankSetsIt) {
  served_store s;
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    s.local->set("g1/rank0", value);
  });
  EXPECT_EQ(s.read("g1/rank0", 10s), value);
  setter.join();
  EXPECT_EQ(s.reads->load(), 1) << "the read was held from before the key was set until it was (store_hold "
                                << store_hold.count() << " ms)";
}

TEST(CoordinatorStore, AReadOfAKeyNotSetIsHeldUntilAnotherWorkerSetsIt) {
  served_store s;
  const auto other = std::make_shared<coordinator_store>(s.system, s.coordinator);
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    other->set("g1/rank5", value);
  });

  EXPECT_EQ(s.read("g1/rank5", 10s), value);
  setter.join();
  EXPECT_EQ(s.reads->load(), 1);
  EXPECT_EQ(s.local->get("g1/rank5", clock_type::now()), value) << "the coordinator's own ranks read it too";
  other->close();
}

TEST(CoordinatorStore, AKeyNeverSetIsAskedForOnceAHoldAndNotFoundAtTheDeadline) {
  served_store s;
  const auto start = clock_type::now();
  EXPECT_EQ(s.read("g1/missing", 3500ms), std::nullopt);
  EXPECT_GE(clock_type::now() - start, 3500ms);
  // Holds of 1 s in 3.5 s: 4 reads (the fourth still in flight at the end);
  // at least 2 however late the holds end. Asked every 2 ms, it was hundreds.
  EXPECT_GE(s.reads->load(), 2);
  EXPECT_LE(s.reads->load(), 4);
}

TEST(CoordinatorStore, RanksOfOneProcessReadingOneKeyShareTheRead) {
  served_store s(40ms);
  std::optional<std::vector<char>> first, second;
  std::thread a([&] { first = s.read("g1/rank0", 10s); });
  std::thread b([&] { second = s.read("g1/rank0", 10s); });
  std::this_thread::sleep_for(100ms);
  s.local->set("g1/rank0", value);
  a.join();
  b.join();
  EXPECT_EQ(first, value);
  EXPECT_EQ(second, value);
  EXPECT_EQ(s.reads->load(), 1);
}

}  // namespace
}  // namespace dpactor
