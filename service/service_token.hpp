#pragma once
// The bearer token that guards the control endpoints: the contents of
// service.token_file when it is set, else the environment variable
// DPACTOR_SERVICE_TOKEN; empty when neither is (the control endpoints are
// then off).

#include <string>

namespace dpactor {

inline constexpr const char* service_token_variable = "DPACTOR_SERVICE_TOKEN";

// Throws config_error naming the file when it cannot be read or holds no
// token. Surrounding whitespace (a final newline) is not part of the token.
std::string read_service_token(const std::string& token_file);

}  // namespace dpactor
