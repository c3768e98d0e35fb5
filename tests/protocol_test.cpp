// The actor protocol's registration: every type in the type ID block can be
// made by name and crosses a serializer unchanged; the in-process requests
// that carry promises are not registered; a join of another device kind is
// refused.

#include <gtest/gtest.h>

#include <cstring>
#include <utility>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/coordinator.hpp"
#include "actors/protocol.hpp"

namespace dpactor {
namespace {

template <class T>
T round_trip(caf::actor_system& sys, T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  EXPECT_FALSE(sink(x)) << "serialising " << caf::type_name<T>::value;
  T back;
  caf::binary_deserializer source{sys, buf};
  EXPECT_FALSE(source(back)) << "deserialising " << caf::type_name<T>::value;
  return back;
}

template <caf::type_id_t Id>
void expect_registered(caf::actor_system& sys, int& count) {
  const char* name = caf::type_name_by_id<Id>::value;
  EXPECT_NE(sys.types().make_value(name), nullptr) << name;
  ++count;
}

template <caf::type_id_t... Offsets>
void expect_block_registered(caf::actor_system& sys, int& count, std::integer_sequence<caf::type_id_t, Offsets...>) {
  (expect_registered<caf::id_block::dpactor::begin + Offsets>(sys, count), ...);
}

TEST(Protocol, EveryTypeOfTheBlockIsRegisteredByName) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  int registered = 0;
  expect_block_registered(sys, registered,
                          std::make_integer_sequence<caf::type_id_t, caf::id_block::dpactor::end - caf::id_block::dpactor::begin>{});
  EXPECT_GE(registered, 30);
}

// See Note [Floats cross the network as their bytes]: a state's step
// counter (an int64's bits: denormals), a NaN with a payload and a
// negative zero cross a serializer bit for bit, in every message that
// carries floats to another process.
TEST(Protocol, FloatsCrossASerializerBitForBit) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  std::vector<float> odd(4);
  const std::int64_t counter = 235;
  std::memcpy(odd.data(), &counter, sizeof counter);
  const std::uint32_t nan_bits = 0x7fc00001u, negative_zero = 0x80000000u;
  std::memcpy(&odd[2], &nan_bits, sizeof nan_bits);
  std::memcpy(&odd[3], &negative_zero, sizeof negative_zero);
  const auto same = [&](const std::vector<float>& back, const char* what) {
    ASSERT_EQ(back.size(), odd.size()) << what;
    EXPECT_EQ(std::memcmp(back.data(), odd.data(), odd.size() * sizeof(float)), 0) << what;
  };
  state_msg s;
  s.step = 3;
  s.state = odd;
  same(round_trip(sys, s).state, "state_msg");
  worker_states_msg w;
  w.workers = {1};
  w.states = odd;
  same(round_trip(sys, w).states, "worker_states_msg");
  device_failed_msg d;
  d.state = odd;
  same(round_trip(sys, d).state, "device_failed_msg");
  async_remote_round_msg r;
  r.rows = {5, 7};
  r.global = odd;
  r.state = odd;
  const async_remote_round_msg r2 = round_trip(sys, r);
  same(r2.global, "async_remote_round_msg.global");
  same(r2.state, "async_remote_round_msg.state");
  EXPECT_EQ(r2.rows, r.rows);
  async_remote_contribution_msg c;
  c.values = odd;
  c.state = odd;
  c.samples = 9;
  const async_remote_contribution_msg c2 = round_trip(sys, c);
  same(c2.values, "async_remote_contribution_msg.values");
  same(c2.state, "async_remote_contribution_msg.state");
  EXPECT_EQ(c2.samples, 9);
}

TEST(Protocol, InProcessRequestsAreNotRegistered) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  EXPECT_EQ(sys.types().make_value(typeid(params_request)), nullptr);
  EXPECT_EQ(sys.types().make_value(typeid(add_device_msg)), nullptr);
}

TEST(Protocol, MessagesCrossASerializerUnchanged) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  const shard_msg shards{7, {step_shard{3, 1, {5, 9, 2}, 0, 0, 0, nullptr}, step_shard{4, 1, {}, 0, 0, 0, nullptr}}};
  const shard_msg s = round_trip(sys, shards);
  EXPECT_EQ(s.generation, 7);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.steps[0].indices, (std::vector<std::uint32_t>{5, 9, 2}));
  EXPECT_EQ(s.steps[1].step, 4);
  step_shard round{5, 0, {1, 2}, 1, 0, 0, nullptr};
  const std::vector<std::uint32_t> workers{0, 2};  // not a run: travels as a list (See Note [Worker placement])
  round.own(workers);
  const shard_msg rounds = round_trip(sys, shard_msg{7, {round}});
  ASSERT_EQ(rounds.steps.size(), 1u);
  EXPECT_EQ(rounds.steps[0].own_slices, workers);

  step_record r{12, 2, 3.5, 40, 64, 99, 7, {0.25f}, {64.0f}, {0.0f}};
  const steps_done_msg d = round_trip(sys, steps_done_msg{3, 0, {r}});
  ASSERT_EQ(d.steps.size(), 1u);
  EXPECT_EQ(d.steps[0].checksum, 99u);
  EXPECT_EQ(d.steps[0].counter, 7);
  EXPECT_EQ(d.steps[0].compute_s, std::vector<float>{0.25f});

  const write_checkpoint_msg w = round_trip(sys, write_checkpoint_msg{5, 1, true, {1.0f, 2.0f}, {1, 17, {3, 4}}});
  EXPECT_EQ(w.state, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(w.position.front, (std::vector<std::uint32_t>{3, 4}));

  group_ticket ticket{"gloo", 4, "store/4", nullptr};
  const generation_plan p = round_trip(sys, generation_plan{4, {}, {}, 1, ticket, -2, {0, 1}, {0, 0, 1}});
  EXPECT_EQ(p.group.rendezvous_id, "store/4");
  EXPECT_EQ(p.state_source, 1);
  EXPECT_EQ(p.worker_node, (std::vector<std::int32_t>{0, 0, 1}));

  join_msg j;
  j.node = "W";
  j.names = {"W/gpu:0", "W/gpu:1"};
  j.gpus = {2, 3};
  const join_msg jb = round_trip(sys, j);
  EXPECT_EQ(jb.names, j.names);
  EXPECT_EQ(jb.gpus, (std::vector<std::int32_t>{2, 3})) << "each device's kind crosses to the coordinator";
}

// One backend per generation (NCCL for GPUs, Gloo for CPU replicas): a
// worker of the other kind is refused, naming its device.
TEST(Coordinator, AJoinOfTheOtherDeviceKindIsRefusedNamingTheDevice) {
  join_msg cpus;
  cpus.devices.resize(2);
  cpus.names = {"W/cpu:0", "W/cpu:1"};
  cpus.gpus = {-1, -1};
  join_msg gpus = cpus;
  gpus.names = {"G/gpu:0", "G/gpu:1"};
  gpus.gpus = {0, 1};
  EXPECT_EQ(kind_difference(false, cpus), "");
  EXPECT_EQ(kind_difference(true, gpus), "");
  EXPECT_EQ(kind_difference(true, cpus),
            "its device W/cpu:0 is a CPU replica and the job's are GPUs: every member of a job is of one kind");
  EXPECT_EQ(kind_difference(false, gpus),
            "its device G/gpu:0 is a GPU and the job's are CPU replicas: every member of a job is of one kind");
  join_msg silent = cpus;
  silent.gpus.clear();
  EXPECT_NE(kind_difference(false, silent), "") << "a join that does not give its devices' kinds";
}

}  // namespace
}  // namespace dpactor
