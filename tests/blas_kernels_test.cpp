// The OpenBLAS kernel choice: the table, and the dpactor command's re-execution.
// See Note [OpenBLAS kernels on CPUs newer than the library].

#include "tensors/blas_kernels.hpp"

#include <cstdlib>

#include <gtest/gtest.h>

#include "tests/test_support.hpp"

namespace dpactor {
namespace {

cpu_vector_features sse_only() { return {}; }
cpu_vector_features avx2_cpu() { return {.avx = true, .avx2_fma = true}; }
cpu_vector_features avx512_cpu() { return {.avx = true, .avx2_fma = true, .avx512 = true}; }
cpu_vector_features avx512_bf16_cpu() { return {.avx = true, .avx2_fma = true, .avx512 = true, .avx512_bf16 = true}; }

TEST(BlasKernels, TheSse3FallbackOnAnAvx512CpuBecomesTheAvx512Kernels) {
  EXPECT_EQ(better_blas_kernels("Prescott", avx512_bf16_cpu()), "Cooperlake");
  EXPECT_EQ(better_blas_kernels("Prescott", avx512_cpu()), "SkylakeX");
}

TEST(BlasKernels, OlderKernelsOnAnAvx2CpuBecomeHaswell) {
  EXPECT_EQ(better_blas_kernels("Nehalem", avx2_cpu()), "Haswell");
  EXPECT_EQ(better_blas_kernels("Sandybridge", avx2_cpu()), "Haswell");
  EXPECT_EQ(better_blas_kernels("Core2", avx512_cpu()), "SkylakeX");
}

TEST(BlasKernels, KernelsAsWideAsTheCpuAllowsAreLeftAlone) {
  EXPECT_EQ(better_blas_kernels("Haswell", avx2_cpu()), std::nullopt);
  EXPECT_EQ(better_blas_kernels("Zen", avx2_cpu()), std::nullopt);
  EXPECT_EQ(better_blas_kernels("SkylakeX", avx512_bf16_cpu()), std::nullopt);
  EXPECT_EQ(better_blas_kernels("Cooperlake", avx512_bf16_cpu()), std::nullopt);
  EXPECT_EQ(better_blas_kernels("Prescott", sse_only()), std::nullopt);
}

TEST(BlasKernels, WiderKernelsThanTheCpuReportsAreNotNarrowed) {
  // Someone set OPENBLAS_CORETYPE high, or the features are hidden by a hypervisor: not ours to undo.
  EXPECT_EQ(better_blas_kernels("SkylakeX", avx2_cpu()), std::nullopt);
}

TEST(BlasKernels, NamesAreMatchedWithoutCaseAndUnknownNamesAreLeftAlone) {
  EXPECT_EQ(better_blas_kernels("PRESCOTT", avx2_cpu()), "Haswell");
  EXPECT_EQ(better_blas_kernels("Unknown", avx512_cpu()), std::nullopt);
  EXPECT_EQ(better_blas_kernels("ARMV8", avx512_cpu()), std::nullopt);
  EXPECT_EQ(better_blas_kernels("", avx512_cpu()), std::nullopt);
}

// What OpenBLAS picks here by itself: known when this test program was
// re-executed (the note), or when nothing set OPENBLAS_CORETYPE.
std::optional<bool> openblas_alone_picks_narrow_kernels() {
  if (blas_kernels_note()) return true;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) return better_blas_kernels_here().has_value();
  return std::nullopt;
}

TEST(BlasKernelsCli, TheCommandRestartsWithWiderKernelsOnlyWhenOpenBlasPickedNarrowOnes) {
  const auto narrow = openblas_alone_picks_narrow_kernels();
  if (!narrow) GTEST_SKIP() << "OPENBLAS_CORETYPE was set outside the tests; what OpenBLAS picks alone is unknown";
  testing::scratch_dir dir;
  testing::write_text(dir.path() / "job.cfg", "");
  const auto r =
      testing::cli_process({"--model", "job.cfg", "--print-config"}, dir.path(), {{"OPENBLAS_CORETYPE", std::nullopt}})
          .wait();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (*narrow) {
    EXPECT_NE(r.output.find("restarted with OPENBLAS_CORETYPE=" + blas_kernels_in_use()), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.output.find("restarted"), std::string::npos) << r.output;
  }
}

TEST(BlasKernelsCli, AUsersOwnChoiceIsKept) {
  testing::scratch_dir dir;
  testing::write_text(dir.path() / "job.cfg", "");
  const auto r =
      testing::cli_process({"--model", "job.cfg", "--print-config"}, dir.path(), {{"OPENBLAS_CORETYPE", "Prescott"}})
          .wait();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("restarted"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dpactor
