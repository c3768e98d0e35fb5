#pragma once
// Row-major single-precision GEMM through OpenBLAS. Shapes are in the comments
// of each caller; this wrapper only fixes the row-major convention.

namespace dpactor {

// C(m, n) = alpha * op(A) * op(B) + beta * C, all row-major.
// op(A) is (m, k): A is (m, k), or (k, m) when trans_a.
// op(B) is (k, n): B is (k, n), or (n, k) when trans_b.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) noexcept;

// Threads OpenBLAS uses per call. The setting is process-wide; every replica
// thread then runs its own single-threaded GEMMs side by side.
void set_blas_threads(int threads) noexcept;
int blas_threads() noexcept;

}  // namespace dpactor
