#include "actors/network.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/io/all.hpp>
#include <future>
#include <stdexcept>
#include <thread>

#include "actors/launch.hpp"
#include <dpactor/version.hpp>
#include <dpactor/error.hpp>

namespace dpactor {

// Peers of another program version share no identifier and are refused by
// CAF itself (incompatible_application_ids).
const std::string app_identifier = std::string("dpactor-") + version;

std::unique_ptr<caf::actor_system_config> make_network_config(std::chrono::milliseconds heartbeat,
                                                              std::chrono::milliseconds connection_timeout) {
  auto cfg = make_system_config();
  cfg->load<caf::io::middleman>();
  cfg->set("middleman.app-identifiers", std::vector<std::string>{app_identifier});
  cfg->set("middleman.heartbeat-interval", caf::timespan{heartbeat});
  cfg->set("middleman.connection-timeout", caf::timespan{connection_timeout});
  return cfg;
}

std::string facing_address(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr)
    throw config_error("cannot resolve the coordinator's host " + host);
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string address = "127.0.0.1";
  if (fd >= 0) {
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof(local);
      char text[INET_ADDRSTRLEN] = {};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr)
        address = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return address;
}

}  // namespace dpactor
