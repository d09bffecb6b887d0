// The pause a spinning thread takes between polls of a word another core writes: it frees the
// core's pipeline (and, with SMT, its sibling) and keeps the loop from flooding the memory system.
#pragma once

namespace shoal {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace shoal
