#include "service/service_token.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

std::string trimmed(std::string s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

}  // namespace

std::string read_service_token(const std::string& token_file) {
  if (token_file.empty()) {
    const char* v = std::getenv(service_token_variable);
    return v == nullptr ? std::string() : trimmed(v);
  }
  std::ifstream in(token_file, std::ios::binary);
  if (!in) throw config_error("service.token_file: cannot read " + token_file);
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = trimmed(text.str());
  if (token.empty()) throw config_error("service.token_file: " + token_file + " holds no token");
  if (token.find_first_of(" \t\r\n") != std::string::npos)
    throw config_error("service.token_file: " + token_file + " holds more than one word; a token is one");
  return token;
}

}  // namespace dpactor
