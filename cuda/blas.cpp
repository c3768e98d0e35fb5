#include "cuda/blas.hpp"

namespace dpactor {

cublas_handle::cublas_handle(cudaStream_t stream, bool tf32) {
  CUBLAS_CHECK(cublasCreate(&handle_));
  CUBLAS_CHECK(cublasSetStream(handle_, stream));
  CUBLAS_CHECK(cublasSetMathMode(handle_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
}

cublas_handle::~cublas_handle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void gemm(const cublas_handle& blas, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublasSgemm(blas.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                           &alpha, b, ldb, a, lda, &beta, c, ldc));
}

}  // namespace dpactor
