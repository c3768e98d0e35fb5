// Fault specs: every form parses, and a bad spec is a config error naming it.

#include <gtest/gtest.h>

#include "train/fault_plan.hpp"
#include <dpactor/error.hpp>

namespace dpactor {
namespace {

TEST(FaultSpec, ParsesEveryForm) {
  const fault_spec fail = parse_fault_spec("fail:1@200");
  EXPECT_EQ(fail.kind, fault_kind::fail);
  EXPECT_EQ(fail.device, 1);
  EXPECT_EQ(fail.step, 200);
  EXPECT_EQ(parse_fault_spec("hang:0@5").kind, fault_kind::hang);
  const fault_spec slow = parse_fault_spec("slow:1:3");
  EXPECT_EQ(slow.kind, fault_kind::slow);
  EXPECT_DOUBLE_EQ(slow.factor, 3.0);
  EXPECT_EQ(slow.step, 1) << "from the start by default";
  EXPECT_EQ(parse_fault_spec("slow:2:1.5@40").step, 40);
  const fault_spec jitter = parse_fault_spec("jitter:0:0.1:20");
  EXPECT_DOUBLE_EQ(jitter.probability, 0.1);
  EXPECT_DOUBLE_EQ(jitter.delay_ms, 20.0);
  EXPECT_EQ(parse_fault_spec("leave:0@300").kind, fault_kind::leave);
  const fault_spec join = parse_fault_spec("join:cpu@100");
  EXPECT_EQ(join.kind, fault_kind::join);
  EXPECT_EQ(join.step, 100);
  EXPECT_TRUE(is_device_fault(fail));
  EXPECT_FALSE(is_device_fault(join));
  const fault_spec kill = parse_fault_spec("kill:2@30");
  EXPECT_EQ(kill.kind, fault_kind::kill);
  EXPECT_EQ(kill.device, 2);
  EXPECT_EQ(kill.step, 30);
  EXPECT_TRUE(is_device_fault(kill)) << "it reaches a worker's device as the others do";
}

TEST(FaultSpec, BadSpecsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"fail:1", "'fail' needs a step"},
      {"explode:1@3", "unknown fault 'explode'"},
      {"slow:1:0.5", "factor must be above 1"},
      // A fault that cannot act is refused, not silently a no-op.
      {"slow:1:inf", "factor must be above 1 and at most 10000"},
      {"slow:1:1", "factor must be above 1"},
      {"slow:1:nan", "factor must be above 1"},
      {"jitter:0:2:20", "probability must be above 0 and at most 1"},
      {"jitter:0:0:20", "probability must be above 0"},
      {"jitter:0:0.5:0", "delay must be above 0 ms"},
      {"jitter:0:0.5:inf", "delay must be above 0 ms and at most"},
      {"jitter:0:0.1:20@5", "takes no @S"},
      {"fail:x@3", "device 'x' is not a number"},
      {"fail:1@0", "steps count from 1"},
      {"join:gpu@3", "only CPU devices can join"},
  };
  for (const auto& [spec, fragment] : cases) {
    try {
      parse_fault_spec(spec);
      ADD_FAILURE() << "accepted " << spec;
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("fault spec '" + spec + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dpactor
