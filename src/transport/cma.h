// Single-copy reads from (and writes to) a peer process's memory: Linux cross-memory attach (process_vm_readv),
// what Open MPI's shared-memory transport calls CMA. The kernel copies straight from the peer's
// pages into this process's: one copy where shared memory takes two (the owner's copy into its
// segment, the reader's copy out). It needs ptrace access to the peer (the same user, and no
// Yama ptrace_scope above 0 or container seccomp profile forbidding the call), so a group probes
// it once, when it forms, and falls back to the two copies where it is refused.
#pragma once
#include <cstddef>
#include <cstdint>

namespace shoal::cma {

// Whether this process can read process `pid`'s memory at `addr` and finds `expect` there. A
// wrong pid (another pid namespace: a container) reads another process or nothing, and fails.
bool probe(int pid, uint64_t addr, uint64_t expect);
// Reads n bytes at `remote` in process `pid` into `local`. Returns 0, or the errno of the call
// that failed (ESRCH: the process is gone).
int read(int pid, const void* remote, void* local, size_t n);
// Writes n bytes at `local` to `remote` in process `pid` (process_vm_writev); returns as read().
int write(int pid, const void* local, void* remote, size_t n);

}  // namespace shoal::cma
