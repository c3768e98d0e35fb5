// The rendezvous stores' reads (See Note [Rendezvous store], Note [One read
// for a rank's peers]): get_many fills what is set, waits for the rest at
// most until its deadline, and keeps what it filled. The coordinator's store
// over CAF is read this way by every multi-process test's rendezvous.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comms/rendezvous_store.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

void expect_get_many(rendezvous_store& store, const std::string& what) {
  const std::vector<std::string> keys = {"g1/gloo/0", "g1/gloo/2", "g1/gloo/3"};
  store.set("g1/gloo/0", {'a'});
  store.set("g1/gloo/3", {'c', 'd'});
  std::vector<std::optional<std::vector<char>>> values(keys.size());
  const auto start = rendezvous_store::clock::now();
  EXPECT_FALSE(store.get_many(keys, values, start + 30ms)) << what << ": a key is missing";
  EXPECT_GE(rendezvous_store::clock::now() - start, 30ms) << what << ": it waited for it";
  ASSERT_TRUE(values[0] && values[2]) << what << ": the keys set are filled";
  EXPECT_EQ(*values[2], (std::vector<char>{'c', 'd'})) << what;
  EXPECT_FALSE(values[1]) << what;
  std::thread later([&] {
    std::this_thread::sleep_for(20ms);
    store.set("g1/gloo/2", {'b'});
  });
  EXPECT_TRUE(store.get_many(keys, values, rendezvous_store::clock::now() + 10s)) << what;
  later.join();
  ASSERT_TRUE(values[1]) << what;
  EXPECT_EQ(*values[1], (std::vector<char>{'b'})) << what;
  EXPECT_EQ(*values[0], (std::vector<char>{'a'})) << what << ": what was filled stays";
}

TEST(RendezvousStore, GetManyFillsWhatIsSetAndWaitsForTheRestUntilItsDeadline) {
  expect_get_many(*make_memory_store(), "memory store");
  testing::scratch_dir dir;
  expect_get_many(*make_directory_store(dir / "store"), "directory store");
}

}  // namespace
}  // namespace dpactor
