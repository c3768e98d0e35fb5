#include "tensors/gemm.hpp"

#include <cblas.h>

namespace dpactor {

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) noexcept {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_blas_threads(int threads) noexcept { openblas_set_num_threads(threads); }

int blas_threads() noexcept { return openblas_get_num_threads(); }

}  // namespace dpactor
