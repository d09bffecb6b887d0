// Prefetches for a store: the lines of [p, p + bytes), p at a line's start, come into this core's
// cache in a state it may write, so that a store to them later does not wait, in the store
// buffer, for another core to give a line up (and every store behind it with it). A hint: nothing
// where the CPU lacks the instruction (x86's PREFETCHW: CPUID 0x80000001, ECX bit 8, read once
// when the library loads).
#pragma once
#include <cstddef>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace shoal {

#if defined(__x86_64__) || defined(__i386__)
inline const bool has_prefetchw = [] {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 8)) != 0;
}();
#endif

inline void prefetch_for_write(const void* p, size_t bytes = 1) {
  const auto* line = static_cast<const char*>(p);
#if defined(__x86_64__) || defined(__i386__)
  if (!has_prefetchw) return;
  for (size_t o = 0; o < bytes; o += 64) asm volatile("prefetchw %0" ::"m"(line[o]));
#else
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(line + o, 1);
#endif
}

}  // namespace shoal
