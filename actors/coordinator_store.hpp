#pragma once
// The coordinator's rendezvous store across processes: a worker's view of it
// (coordinator_store) and the watch that tells the coordinator actor of
// every key set, so that it can answer the reads it holds.
//
// Note [Held store reads]
// A worker's ranks read the coordinator's store through CAF (Note
// [Rendezvous store]). The coordinator holds a read of a key not yet set
// until the key is set or store_hold passes, and answers then: a rank waiting
// for a peer's key asks about once a second, not every few milliseconds (65
// ranks each reading 64 peers' keys made the coordinator answer a read every
// 2 ms per rank). A rank's get() still returns after its slice
// (store_poll_slice) so that it sees an abort, and the read it sent stays in
// flight: the next get() of that key waits for the same answer instead of
// sending another, and ranks of one process reading one key share it.
// Before, a read not answered within the slice was given up and sent again:
// once the coordinator took longer than a slice to answer, every answer came
// to a read already given up, the coordinator's queue only grew, and no rank
// read any key (a cause of the 65-process rendezvous that did not form,
// docs/scale.md; `CoordinatorStore.ASlowCoordinatorIsWaitedForNotAskedAgain`).

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/node_messages.hpp"
#include "comms/rendezvous_store.hpp"

namespace dpactor {

// How long the coordinator holds a read of a key that is not set.
inline constexpr std::chrono::milliseconds store_hold{1000};

// The store as a worker process sees it: reads and writes go to
// `coordinator` (a coordinator_behavior actor, or anything that answers
// store_get_msg and takes store_set_msg), reads through a proxy actor
// spawned in `system`. Thread-safe.
class coordinator_store final : public rendezvous_store {
 public:
  coordinator_store(caf::actor_system& system, caf::actor coordinator);
  void set(const std::string& key, const std::vector<char>& value) override;
  std::optional<std::vector<char>> get(const std::string& key, clock::time_point until) override;
  void prefetch(const std::vector<std::string>& keys) override;
  void erase_prefix(const std::string&) override {}  // the coordinator's to do
  // Stops the proxy: reads after this are not answered.
  void close();

  // What a read comes back with.
  struct answer {
    bool delivered = false;  // false: the request failed
    store_value_msg value;
  };

 private:
  std::shared_future<answer> in_flight(const std::string& key);
  void answered(const std::string& key);

  caf::actor coordinator_;
  caf::actor proxy_;
  std::mutex mutex_;
  std::map<std::string, std::shared_future<answer>> reads_;
};

// Passes each key set in the coordinator's memory store to the coordinator
// actor, once attached (its own ranks set keys directly).
class store_watch {
 public:
  void attach(caf::actor coordinator);
  void changed(const std::string& key);

 private:
  std::mutex mutex_;
  caf::actor coordinator_;
};

}  // namespace dpactor
