// Prefetches for a store: the line at `p` comes into this core's cache in a state it may write,
// so that a store to it later does not wait, in the store buffer, for another core to give the
// line up (and every store behind it with it). A hint: nothing where the CPU lacks the
// instruction (x86's PREFETCHW, checked once).
#pragma once

namespace shoal {

inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("prfchw") != 0;
  }();
  if (has) asm volatile("prefetchw %0" ::"m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1);
#endif
}

}  // namespace shoal
