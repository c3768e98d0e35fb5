#pragma once
// Which kernels OpenBLAS runs on this CPU, and a better choice when it guessed low.
//
// See Note [OpenBLAS kernels on CPUs newer than the library].

#include <optional>
#include <string>
#include <string_view>

namespace dpactor {

// Note [OpenBLAS kernels on CPUs newer than the library]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Debian's OpenBLAS is built with DYNAMIC_ARCH: at load time it reads the CPU's
// family and model and picks a kernel set. A model it does not know falls back
// to its oldest x86-64 kernels. OpenBLAS 0.3.21 (Debian 12) does not know Intel
// Emerald Rapids (family 6, model 207) and runs "Prescott" SSE3 kernels there:
// measured on such a VM, numpy's 1024^3 sgemm on 2 threads gave 38 GFLOP/s, and
// 195 to 212 with OPENBLAS_CORETYPE=SkylakeX or Cooperlake, the AVX-512
// kernels the CPU can run. Every dpactor GEMM pays the same factor.
//
// The choice is made in OpenBLAS's load-time constructor, before main(), and
// there is no call to change it afterwards: only the environment variable
// OPENBLAS_CORETYPE, read by that constructor, overrides it. So:
// - the dpactor command re-executes itself once with OPENBLAS_CORETYPE set
//   (reexec_with_better_blas_kernels, first thing in main), and says so;
// - a service embedding the engine gets a warning naming the variable to set;
// - a user's own OPENBLAS_CORETYPE is always left alone.
// The kernels change the last bits of every GEMM: reproducible runs compare
// bytes on one machine type with one kernel choice (docs/reproducibility.md).

// The instruction sets that decide which OpenBLAS kernels a CPU can run.
struct cpu_vector_features {
  bool avx = false;
  bool avx2_fma = false;     // AVX2 and FMA3
  bool avx512 = false;       // AVX-512 F, DQ, BW and VL (OpenBLAS's SkylakeX kernels)
  bool avx512_bf16 = false;  // adds AVX512_BF16 (its Cooperlake kernels)
};

cpu_vector_features detected_cpu_vector_features() noexcept;

// The kernel set OpenBLAS chose ("Prescott", "Haswell", "SkylakeX", ...).
std::string blas_kernels_in_use();

// The OPENBLAS_CORETYPE that runs wider kernels than `in_use` on a CPU with
// `cpu`, or nothing when `in_use` is as good as the CPU allows or is a name
// this table does not know (non-x86 builds, future kernel sets).
std::optional<std::string> better_blas_kernels(std::string_view in_use, const cpu_vector_features& cpu);

// better_blas_kernels for this process, or nothing when the user set
// OPENBLAS_CORETYPE.
std::optional<std::string> better_blas_kernels_here();

// Re-executes this program (/proc/self/exe, same arguments) with
// OPENBLAS_CORETYPE set when better_blas_kernels_here() has a choice. Call it
// first thing in main, before any thread starts. Returns only when it did not
// re-execute: nothing better, or exec failed (then the run goes on with the
// kernels it has). In the re-executed process, blas_kernels_note() says what
// happened, once, for the log.
void reexec_with_better_blas_kernels(char** argv) noexcept;
std::optional<std::string> blas_kernels_note();

}  // namespace dpactor
