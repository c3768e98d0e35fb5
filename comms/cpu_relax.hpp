#pragma once
// A pause inside a spin-wait: the x86 PAUSE instruction (it frees the core's
// resources for its sibling thread and saves power), else a yield.

#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dpactor {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace dpactor
