// Stands in for the gpu-labelled suite when dpactor is built without the CUDA
// toolkit, so that `ctest -L gpu` says why nothing ran.

#include <gtest/gtest.h>

TEST(Gpu, NeedsTheCudaBackend) {
  GTEST_SKIP() << "built without CUDA (no nvcc found, or DPACTOR_WITH_CUDA=OFF): GPU tests not compiled";
}
