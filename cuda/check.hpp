#pragma once
// Checked CUDA and NCCL calls (cuBLAS's are checked in cuda/blas.cpp): a failure throws cuda_error naming the
// file, the line, the call, the library's message and a hint for the user.
//   CUDA_CHECK(cudaMalloc(&p, bytes));

#include <string>

#include <dpactor/error.hpp>

namespace dpactor {

struct cuda_error : error {
  explicit cuda_error(const std::string& what) : error(error_kind::training, what) {}
};

[[noreturn]] void throw_cuda_error(const char* library, const char* call, const char* file, int line,
                                   const std::string& message, const char* hint);

// A hint for common failures ("out of memory: lower train.micro_batch", ...).
const char* cuda_hint(int code) noexcept;

}  // namespace dpactor

#define CUDA_CHECK(call)                                                                                   \
  do {                                                                                                     \
    const cudaError_t dpactor_status_ = (call);                                                            \
    if (dpactor_status_ != cudaSuccess)                                                                    \
      ::dpactor::throw_cuda_error("CUDA", #call, __FILE__, __LINE__, cudaGetErrorString(dpactor_status_),  \
                                  ::dpactor::cuda_hint(static_cast<int>(dpactor_status_)));                \
  } while (false)

#define NCCL_CHECK(call)                                                                                   \
  do {                                                                                                     \
    const ncclResult_t dpactor_status_ = (call);                                                           \
    if (dpactor_status_ != ncclSuccess && dpactor_status_ != ncclInProgress)                               \
      ::dpactor::throw_cuda_error("NCCL", #call, __FILE__, __LINE__, ncclGetErrorString(dpactor_status_),  \
                                  "set NCCL_DEBUG=WARN for NCCL's own account of the failure");            \
  } while (false)
