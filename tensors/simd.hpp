#pragma once
// Element-wise kernels are compiled several times, for AVX-512, AVX2+FMA and
// baseline x86-64, and the loader picks the best the CPU runs (GCC function
// multi-versioning): fast on the machine at hand, no -march flag, and one
// binary runs everywhere. Other compilers and CPUs get the plain version.

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(DPACTOR_NO_MULTIVERSIONING)
#define DPACTOR_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DPACTOR_MULTIVERSION
#endif
