// Note [Memory before allocating], alone: the estimate of a job's memory,
// its refusal naming the estimate against what is available, and the
// estimate against the allocations of a real replica.

#include <gtest/gtest.h>

#include "config/config_file.hpp"
#include "config/memory_needs.hpp"
#include "tensors/cpu_replica.hpp"
#include <dpactor/error.hpp>
#include "tests/test_support.hpp"
#include "train/memory_estimate.hpp"

namespace dpactor {
namespace {

TEST(MemoryEstimate, CountsEachReplicasStateGradientsAndActivationsAndTheDataOnce) {
  // A 4-8-2 MLP with SGD momentum (one slot): 58 parameters, 64 floats of
  // padding per tensor.
  const job_config c = parse_job_config("[model]\nlayers = [4, 8, 2]\n[train]\nmicro_batch = 10\nreproducible = false\n",
                                        "job.cfg");
  const memory_inputs in = memory_needs(c, 0.0, 3, 1000.0);
  EXPECT_EQ(in.parameters, 58.0 + 4 * 64.0);
  EXPECT_EQ(in.state, 2 * in.parameters + 16.0);
  const memory_estimate e = estimate_memory(in);
  // State twice, gradients once; inputs, labels, two buffers per layer and
  // two of the widest.
  const double activations = 10.0 * (4 + 1 + 2 * (8 + 2) + 2 * 8) * 4.0;
  EXPECT_DOUBLE_EQ(e.per_replica, 2 * in.state * 4.0 + in.parameters * 4.0 + activations);
  EXPECT_DOUBLE_EQ(e.shared, in.state * 4.0 + 1000.0);
  EXPECT_DOUBLE_EQ(e.total(3), 3 * e.per_replica + e.shared);
}

TEST(MemoryEstimate, IsAnUpperBoundOfWhatARealReplicaAllocates) {
  const job_config c = parse_job_config("[model]\nlayers = [64, 128, 10]\n[train]\nmicro_batch = 32\n", "job.cfg");
  const memory_estimate e = estimate_memory(memory_needs(c, 0.0, 1, 0.0));
  cpu_replica replica(c.model, c.optimizer, 32);
  const double state = 2.0 * static_cast<double>(replica.layout().total_size()) * 4.0;
  const double gradients = static_cast<double>(replica.layout().parameter_size) * 4.0;
  EXPECT_GE(e.per_replica, state + gradients) << "the estimate leaves out what the replica holds";
}

TEST(MemoryEstimate, AJobThatDoesNotFitIsRefusedWithTheEstimateAndWhatIsAvailable) {
  const job_config c = parse_job_config("[model]\nlayers = [784, 16000000, 16000000, 10]\n", "job.cfg");
  const std::string message = testing::error_of<config_error>(
      [&] { check_memory(memory_needs(c, 0.0, 2, 0.0), memory_limit{24.0 * (1ull << 30), "the kernel's MemAvailable"}); });
  const memory_estimate e = estimate_memory(memory_needs(c, 0.0, 2, 0.0));
  EXPECT_EQ(message.find("the job needs about " + byte_text(e.total(2)) + " of memory: per replica " +
                         byte_text(e.per_replica) + " (state"),
            0u)
      << message;
  EXPECT_NE(message.find(" PiB of memory"), std::string::npos) << message;
  EXPECT_NE(message.find(") x 2 replicas, and once"), std::string::npos) << message;
  EXPECT_NE(message.find("this machine has 24.0 GiB available (the kernel's MemAvailable)"), std::string::npos) << message;
  // What fits passes.
  const job_config small = parse_job_config("", "job.cfg");
  check_memory(memory_needs(small, 0.0, 2, 1e8), memory_limit{24.0 * (1ull << 30), "test"});
}

TEST(MemoryEstimate, WhatIsAvailableIsNamed) {
  const memory_limit limit = available_memory();
  EXPECT_GT(limit.bytes, 0.0);
  EXPECT_FALSE(limit.source.empty());
  EXPECT_EQ(byte_text(512), "512 bytes");
  EXPECT_EQ(byte_text(1536.0 * 1024 * 1024), "1.5 GiB");
}

}  // namespace
}  // namespace dpactor
