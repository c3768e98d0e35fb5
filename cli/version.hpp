#pragma once

namespace dpactor::cli {
inline constexpr const char* version = "0.1.0";
}
