#include "cuda/check.hpp"

#include <cuda_runtime.h>

namespace dpactor {

void throw_cuda_error(const char* library, const char* call, const char* file, int line, const std::string& message,
                      const char* hint) {
  std::string what = std::string(file) + ":" + std::to_string(line) + ": " + library + " call " + call +
                     " failed: " + message;
  if (hint != nullptr && *hint != '\0') what += " (" + std::string(hint) + ")";
  throw cuda_error(what);
}

const char* cuda_hint(int code) noexcept {
  switch (static_cast<cudaError_t>(code)) {
    case cudaErrorMemoryAllocation: return "out of GPU memory: lower train.micro_batch or use fewer replicas per GPU";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver: return "no usable GPU or driver: run with --gpus 0 to train on CPU replicas";
    case cudaErrorInvalidDevice: return "the GPU number is not visible: check --gpus and CUDA_VISIBLE_DEVICES";
    case cudaErrorLaunchTimeout:
    case cudaErrorIllegalAddress: return "the GPU context is lost: the device must be removed from training";
    default: return "";
  }
}

}  // namespace dpactor
