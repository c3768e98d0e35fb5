#pragma once
// cuBLAS for the MLP's GEMMs, in the row-major convention of tensors/gemm.hpp.
// fp32 by default; TF32 tensor cores only when asked (precision.matmul = "tf32").

#include <cublas_v2.h>

#include "cuda/check.hpp"

namespace dpactor {

class cublas_handle {
 public:
  cublas_handle(cudaStream_t stream, bool tf32);
  ~cublas_handle();
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  cublasHandle_t get() const noexcept { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// C(m, n) = alpha op(A) op(B) + beta C, row-major, device pointers. Row-major
// C is column-major C^T = op(B)^T op(A)^T, which is what cuBLAS is asked.
void gemm(const cublas_handle& blas, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace dpactor
