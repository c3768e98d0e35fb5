// main() of every test program: gtest's, after the same OpenBLAS kernel choice
// the dpactor command makes, so tests run (and compare bytes with) the kernels
// a user's run gets. See Note [OpenBLAS kernels on CPUs newer than the library].

#include <gtest/gtest.h>

#include "tensors/blas_kernels.hpp"

int main(int argc, char** argv) {
  dpactor::reexec_with_better_blas_kernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
