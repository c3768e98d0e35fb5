// Roles from a launcher's environment (See Note [Roles from the launcher]):
// torchrun (static and c10d rendezvous), Kubeflow, SLURM, DPACTOR_COORDINATOR,
// and the errors that name a malformed variable.

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "config/launcher_env.hpp"
#include <dpactor/error.hpp>
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

using env_map = std::map<std::string, std::string>;

std::optional<launcher_role> role(const env_map& vars) {
  return role_from_environment([&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The config_error that reading the launcher's variables `vars` gives.
std::string role_error(const env_map& vars) {
  return testing::error_of<config_error>([&] { role(vars); });
}

TEST(LauncherEnv, NoLauncherAndAWorldOfOneProcessAreNoRole) {
  EXPECT_FALSE(role({}).has_value());
  EXPECT_FALSE(role({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"WORLD_SIZE", "1"}, {"RANK", "0"}}));
  EXPECT_FALSE(role({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}));  // no world size
  EXPECT_FALSE(role({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n1"}}));
}

TEST(LauncherEnv, TorchrunRankZeroCoordinatesAndWaitsForTheOtherRanks) {
  const auto r = role({{"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29400"}, {"WORLD_SIZE", "4"}, {"RANK", "0"},
                       {"LOCAL_WORLD_SIZE", "1"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->coordinator);
  EXPECT_EQ(r->host, "node-a");
  EXPECT_EQ(r->port, 29400);
  EXPECT_EQ(r->workers, 3);
  EXPECT_EQ(r->local_processes, 1);
}

TEST(LauncherEnv, TorchrunOtherRanksJoinRankZero) {
  const auto r = role({{"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29400"}, {"WORLD_SIZE", "4"}, {"RANK", "3"},
                       {"LOCAL_WORLD_SIZE", "2"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->coordinator);
  EXPECT_EQ(r->host, "node-a");
  EXPECT_EQ(r->port, 29400);
  EXPECT_EQ(r->workers, 0);
  EXPECT_EQ(r->local_processes, 2);
}

TEST(LauncherEnv, UnderTorchrunsStaticRendezvousItsStoreHoldsMasterPortAndDpactorTakesTheNext) {
  const env_map base = {{"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29400"}, {"WORLD_SIZE", "2"},
                        {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  for (const char* rank : {"0", "1"}) {
    env_map vars = base;
    vars["RANK"] = rank;
    const auto r = role(vars);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->port, 29401) << "rank " << rank << ": both ends must agree on the port";
  }
  env_map c10d = base;
  c10d["RANK"] = "0";
  c10d["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(role(c10d)->port, 29400);
  env_map own = base;
  own["RANK"] = "1";
  own["DPACTOR_PORT"] = "31000";
  EXPECT_EQ(role(own)->port, 31000);
}

TEST(LauncherEnv, KubeflowWithoutRankUsesGroupRank) {
  const auto r = role({{"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"},
                       {"GROUP_RANK", "0"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->coordinator);
  EXPECT_EQ(r->workers, 2);
}

TEST(LauncherEnv, SlurmTaskZeroCoordinatesOnTheFirstHostOfTheNodeList) {
  const env_map base = {{"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "gpu[07-09,12],cpu1"}};
  env_map zero = base;
  zero["SLURM_PROCID"] = "0";
  const auto c = role(zero);
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->coordinator);
  EXPECT_EQ(c->host, "gpu07");
  EXPECT_EQ(c->port, 29500);
  EXPECT_EQ(c->workers, 2);
  env_map two = base;
  two["SLURM_PROCID"] = "2";
  two["MASTER_PORT"] = "40000";  // without MASTER_ADDR: SLURM's case, on this port
  const auto w = role(two);
  ASSERT_TRUE(w.has_value());
  EXPECT_FALSE(w->coordinator);
  EXPECT_EQ(w->host, "gpu07");
  EXPECT_EQ(w->port, 40000);
}

TEST(LauncherEnv, DpactorCoordinatorMakesAWorkerAndComesFirst) {
  const auto r = role({{"DPACTOR_COORDINATOR", "10.1.2.3:7000"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"},
                       {"WORLD_SIZE", "2"}, {"RANK", "0"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->coordinator);
  EXPECT_EQ(r->host, "10.1.2.3");
  EXPECT_EQ(r->port, 7000);
}

TEST(LauncherEnv, SlurmNodeLists) {
  EXPECT_EQ(first_slurm_host("n1"), "n1");
  EXPECT_EQ(first_slurm_host("n1,n2"), "n1");
  EXPECT_EQ(first_slurm_host("node[3-5]"), "node3");
  EXPECT_EQ(first_slurm_host("node[003-005,9]-ib,x"), "node003-ib");
  EXPECT_EQ(first_slurm_host("rack1-[10,2]"), "rack1-10");
  for (const char* bad : {"", "[1-2]", "node[1-2", "node1-2]", "node[a-b]"}) {
    EXPECT_THROW(first_slurm_host(bad), config_error) << bad;
  }
}

TEST(LauncherEnv, MalformedVariablesAreNamedWithTheirValues) {
  EXPECT_NE(role_error({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "29x"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}})
                .find("MASTER_PORT='29x' is not a whole number"),
            std::string::npos);
  EXPECT_NE(role_error({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}})
                .find("MASTER_PORT='70000' is not a port"),
            std::string::npos);
  EXPECT_NE(role_error({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "2"}, {"RANK", "2"}})
                .find("RANK=2 is not below WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(role_error({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "2"}}).find("neither RANK nor GROUP_RANK"),
            std::string::npos);
  EXPECT_NE(role_error({{"DPACTOR_COORDINATOR", "nohost"}}).find("DPACTOR_COORDINATOR 'nohost' is not HOST:PORT"),
            std::string::npos);
  EXPECT_NE(role_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("SLURM_JOB_NODELIST is not"), std::string::npos);
  EXPECT_NE(role_error({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n"}})
                .find("SLURM_PROCID='-1' is not a whole number"),
            std::string::npos);
}

}  // namespace
}  // namespace dpactor
