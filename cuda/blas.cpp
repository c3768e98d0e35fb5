#include "cuda/blas.hpp"

#include <dlfcn.h>

#include <string>

// Note [cuBLAS is loaded when a GPU replica first needs it]
// Linking libcublas makes every process that loads dpactor pay for cuBLAS's
// (and cuBLASLt's) static initialisation: half a second on a 2-core machine,
// with no GPU in sight, in `dpactor --help`, in every test program and in a
// service that never trains on a GPU. cuBLAS is opened with dlopen at the
// first cublas_handle instead, and its seven functions looked up by name; a
// machine without it fails there, naming the library, not at start-up.
// DPACTOR_CUBLAS_DIR, the toolkit's library folder at build time, is tried
// after the loader's own search (the program's RUNPATH, LD_LIBRARY_PATH).

namespace dpactor {
namespace {

#define DPACTOR_NAME_OF(symbol) DPACTOR_NAME_OF_EXPANDED(symbol)
#define DPACTOR_NAME_OF_EXPANDED(symbol) #symbol

struct cublas_api {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetAtomicsMode) set_atomics_mode = nullptr;
  decltype(&cublasSgemm) sgemm = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

const std::string cublas_soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);

void* open_cublas() {
  if (void* library = ::dlopen(cublas_soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
  std::string why = ::dlerror();
#ifdef DPACTOR_CUBLAS_DIR
  const std::string beside_toolkit = std::string(DPACTOR_CUBLAS_DIR) + "/" + cublas_soname;
  if (void* library = ::dlopen(beside_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
  why += "; " + std::string(::dlerror());
#endif
  throw cuda_error("cuBLAS could not be loaded (" + why +
                   "): install the CUDA toolkit's cuBLAS or add its folder to LD_LIBRARY_PATH");
}

template <class Function>
void look_up(void* library, Function& slot, const char* name) {
  slot = reinterpret_cast<Function>(::dlsym(library, name));
  if (slot == nullptr) throw cuda_error("cuBLAS (" + cublas_soname + ") has no " + name + ": another major version?");
}

cublas_api load_cublas() {
  void* library = open_cublas();  // never closed: handles may live until exit
  cublas_api api;
  look_up(library, api.create, DPACTOR_NAME_OF(cublasCreate));
  look_up(library, api.destroy, DPACTOR_NAME_OF(cublasDestroy));
  look_up(library, api.set_stream, DPACTOR_NAME_OF(cublasSetStream));
  look_up(library, api.set_math_mode, DPACTOR_NAME_OF(cublasSetMathMode));
  look_up(library, api.set_atomics_mode, DPACTOR_NAME_OF(cublasSetAtomicsMode));
  look_up(library, api.sgemm, DPACTOR_NAME_OF(cublasSgemm));
  look_up(library, api.status_string, DPACTOR_NAME_OF(cublasGetStatusString));
  return api;
}

// See Note [cuBLAS is loaded when a GPU replica first needs it].
const cublas_api& cublas() {
  static const cublas_api api = load_cublas();
  return api;
}

}  // namespace

#define CUBLAS_CHECK(call)                                                                                \
  do {                                                                                                    \
    const cublasStatus_t dpactor_status_ = (call);                                                        \
    if (dpactor_status_ != CUBLAS_STATUS_SUCCESS)                                                         \
      throw_cuda_error("cuBLAS", #call, __FILE__, __LINE__, cublas().status_string(dpactor_status_),      \
                       "check the matrix shapes and that the GPU has memory left");                       \
  } while (false)

cublas_handle::cublas_handle(cudaStream_t stream, bool tf32) {
  CUBLAS_CHECK(cublas().create(&handle_));
  CUBLAS_CHECK(cublas().set_stream(handle_, stream));
  CUBLAS_CHECK(cublas().set_math_mode(handle_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
  // Reproducible mode's GEMMs (docs/reproducibility.md, "On GPUs"): one
  // handle per replica on its own stream, and no routine that sums with
  // atomics (cuBLAS's default, said here so that no later default changes it).
  CUBLAS_CHECK(cublas().set_atomics_mode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED));
}

cublas_handle::~cublas_handle() {
  if (handle_ != nullptr) cublas().destroy(handle_);
}

void gemm(const cublas_handle& blas, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublas().sgemm(blas.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                              m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
}

}  // namespace dpactor
