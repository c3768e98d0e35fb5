// Mutual TLS settings (actors/tls.hpp): when TLS is on, and the checks of its
// files that run before anything connects. The handshakes themselves are in
// distributed_test and partition_test.

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "actors/tls.hpp"
#include <dpactor/error.hpp>
#include "test_support.hpp"

namespace dpactor {
namespace {

const std::string dir = std::string(DPACTOR_SOURCE_DIR) + "/tests/data/tls/";

tls_config files(const std::string& name, const std::string& ca = "ca") {
  tls_config t;
  t.mode = tls_mode::on;
  t.ca = dir + ca + ".pem";
  t.certificate = dir + name + ".pem";
  t.key = dir + name + ".key";
  return t;
}

// The config_error that checking `t`'s files gives.
std::string tls_error(const tls_config& t) {
  return testing::error_of<config_error>([&] { check_tls_files(t, "TLS is on"); });
}

TEST(Tls, AutomaticIsOnExactlyOffLoopback) {
  tls_config t;
  for (const char* host : {"127.0.0.1", "127.9.9.9", "localhost", "::1"}) EXPECT_FALSE(tls_enabled(t, host)) << host;
  for (const char* host : {"10.77.0.1", "0.0.0.0", "node-a", "192.168.1.5"}) EXPECT_TRUE(tls_enabled(t, host)) << host;
  t.mode = tls_mode::on;
  EXPECT_TRUE(tls_enabled(t, "127.0.0.1"));
  t.mode = tls_mode::off;
  EXPECT_FALSE(tls_enabled(t, "10.0.0.1"));
}

TEST(Tls, GoodFilesPass) {
  EXPECT_EQ(tls_error(files("coordinator")), testing::no_error);
  EXPECT_EQ(tls_error(files("worker")), testing::no_error);
  EXPECT_EQ(tls_error(files("rogue", "rogue-ca")), testing::no_error);
}

TEST(Tls, EachBadFileIsNamed) {
  testing::scratch_dir scratch;
  const std::string junk = (scratch.path() / "junk.pem").string();
  std::ofstream(junk) << "not a certificate\n";

  tls_config t = files("worker");
  t.key.clear();
  EXPECT_NE(tls_error(t).find("TLS is on, which needs cluster.tls.ca, cluster.tls.certificate and cluster.tls.key; "
                             "cluster.tls.key not set"),
            std::string::npos)
      << tls_error(t);
  t = files("worker");
  t.ca = dir + "missing.pem";
  EXPECT_NE(tls_error(t).find("cluster.tls.ca = " + dir + "missing.pem: no such file"), std::string::npos) << tls_error(t);
  t = files("worker");
  t.ca = junk;
  EXPECT_NE(tls_error(t).find("cluster.tls.ca = " + junk + ": not a PEM CA certificate"), std::string::npos) << tls_error(t);
  t = files("worker");
  t.certificate = junk;
  EXPECT_NE(tls_error(t).find("cluster.tls.certificate = " + junk + ": not a PEM certificate"), std::string::npos)
      << tls_error(t);
  t = files("worker");
  t.key = junk;
  EXPECT_NE(tls_error(t).find("cluster.tls.key = " + junk + ": not an unencrypted PEM private key"), std::string::npos)
      << tls_error(t);
  t = files("worker");
  t.key = dir + "rogue.key";
  EXPECT_NE(tls_error(t).find("does not belong to cluster.tls.certificate = " + dir + "worker.pem"), std::string::npos)
      << tls_error(t);
  t = files("rogue");  // trusting the test CA, which did not sign it
  EXPECT_NE(tls_error(t).find("does not pass the check against cluster.tls.ca"), std::string::npos) << tls_error(t);
}

}  // namespace
}  // namespace dpactor
