#include "tensors/blas_kernels.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <span>

#include <cblas.h>

namespace dpactor {
namespace {

// OpenBLAS's x86-64 kernel sets by the widest vectors they use. Names are
// those openblas_get_corename() returns and OPENBLAS_CORETYPE accepts.
enum class vector_width { sse = 0, avx = 1, avx2 = 2, avx512 = 3 };

// Kernel sets with the widest vectors each uses (see vector_width).
constexpr std::string_view sse_kernels[] = {"Katmai",  "Coppermine", "Northwood", "Prescott",      "Banias",
                                            "Atom",    "Core2",      "Penryn",    "Dunnington",    "Nehalem",
                                            "Athlon",  "Opteron",    "Nano",      "Opteron(SSE3)", "Barcelona",
                                            "Bobcat"};
constexpr std::string_view avx_kernels[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
constexpr std::string_view avx2_kernels[] = {"Haswell", "Excavator", "Zen"};
constexpr std::string_view avx512_kernels[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};

bool same_name(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

// The width of a kernel set named `name`, or nothing for a name not listed.
std::optional<vector_width> width_of(std::string_view name) {
  const auto in = [name](std::span<const std::string_view> names) {
    return std::any_of(names.begin(), names.end(), [name](std::string_view n) { return same_name(n, name); });
  };
  if (in(sse_kernels)) return vector_width::sse;
  if (in(avx_kernels)) return vector_width::avx;
  if (in(avx2_kernels)) return vector_width::avx2;
  if (in(avx512_kernels)) return vector_width::avx512;
  return std::nullopt;
}

vector_width widest(const cpu_vector_features& cpu) {
  if (cpu.avx512) return vector_width::avx512;
  if (cpu.avx2_fma) return vector_width::avx2;
  if (cpu.avx) return vector_width::avx;
  return vector_width::sse;
}

// Set by the process that re-executed; read once by the one it started.
constexpr const char* reexec_marker = "DPACTOR_BLAS_KERNELS_WERE";

std::optional<std::string>& note_slot() {
  static std::optional<std::string> note;
  return note;
}

}  // namespace

cpu_vector_features detected_cpu_vector_features() noexcept {
  cpu_vector_features f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

std::string blas_kernels_in_use() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::optional<std::string> better_blas_kernels(std::string_view in_use, const cpu_vector_features& cpu) {
  const auto width = width_of(in_use);
  if (!width) return std::nullopt;
  const vector_width can = widest(cpu);
  if (*width >= can) return std::nullopt;
  switch (can) {
    case vector_width::avx512: return std::string(cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX");
    case vector_width::avx2: return std::string("Haswell");
    case vector_width::avx: return std::string("Sandybridge");
    case vector_width::sse: break;
  }
  return std::nullopt;
}

std::optional<std::string> better_blas_kernels_here() {
  if (std::getenv("OPENBLAS_CORETYPE")) return std::nullopt;
  return better_blas_kernels(blas_kernels_in_use(), detected_cpu_vector_features());
}

void reexec_with_better_blas_kernels(char** argv) noexcept {
  if (const char* before = std::getenv(reexec_marker)) {
    note_slot() = "OpenBLAS chose its " + std::string(before) + " kernels for this CPU, which runs wider ones; " +
                  "restarted with OPENBLAS_CORETYPE=" + blas_kernels_in_use() +
                  " (set OPENBLAS_CORETYPE yourself to choose)";
    ::unsetenv(reexec_marker);
    return;
  }
  const auto better = better_blas_kernels_here();
  if (!better) return;
  ::setenv(reexec_marker, blas_kernels_in_use().c_str(), 1);
  ::setenv("OPENBLAS_CORETYPE", better->c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // exec failed: go on with the kernels loaded, and leave the environment as it was.
  ::unsetenv(reexec_marker);
  ::unsetenv("OPENBLAS_CORETYPE");
}

std::optional<std::string> blas_kernels_note() { return note_slot(); }

}  // namespace dpactor
