#pragma once
// Note [Rendezvous store]
// The ranks of a multi-process group find each other through a key-value
// store: each publishes its connection addresses under the generation's
// prefix and reads the others'. Keys are written once per generation; a
// generation's keys are erased when it ends. A get waits for the key, but
// only up to the time given, so that a rank waiting in rendezvous sees an
// abort (its group's) within one slice: the Gloo backend asks in slices of
// store_poll_slice and checks for an abort in between.
//
// Implementations: the memory store (ranks as threads of one process), the
// directory store (processes sharing a file system: tests, and launches whose
// nodes share a directory, like torch's FileStore), and the coordinator's
// store served over CAF (actors/, the one piece of CAF outside actors' own
// protocol; see DESIGN.md "Across nodes").

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dpactor {

// How long one get() may wait before the caller checks for an abort.
inline constexpr std::chrono::milliseconds store_poll_slice{10};

class rendezvous_store {
 public:
  using clock = std::chrono::steady_clock;
  virtual ~rendezvous_store() = default;
  // Thread-safe. Sets `key`; setting it again replaces the value.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // The value of `key` once it is set, waiting at most until `until`;
  // nullopt if it is not set by then. Throws std::runtime_error when the
  // store itself fails (unreachable, unreadable).
  virtual std::optional<std::vector<char>> get(const std::string& key, clock::time_point until) = 0;
  // Says that `keys` will be read soon: a store whose reads are round trips
  // (the coordinator's, across processes) sends them all now, so that reads
  // one after the other wait for one round trip, not one each.
  virtual void prefetch(const std::vector<std::string>& /*keys*/) {}
  // Erases every key that starts with `prefix`.
  virtual void erase_prefix(const std::string& prefix) = 0;
};

// Ranks as threads of one process. `on_set`, when given, is called with the
// key after every set, outside the store's lock (the coordinator serves the
// store to other processes and answers their held gets from it).
std::shared_ptr<rendezvous_store> make_memory_store(std::function<void(const std::string& key)> on_set = {});

// Processes that share `directory` (created if missing): a key is a file,
// written under a temporary name and renamed, so a reader never sees half a
// value. Keys may contain '/'; they are escaped into one file name.
std::shared_ptr<rendezvous_store> make_directory_store(const std::filesystem::path& directory);

}  // namespace dpactor
