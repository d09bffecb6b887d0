// The CPUs a process may run on, and how many the ranks of one machine have between them: what
// decides whether a waiting rank polls (each rank has a CPU) or hands its CPU over at once (ranks
// outnumber the CPUs they may use).
//
// The affinity mask, not the CPUs online: taskset, numactl, the cpusets of containers
// (`docker run --cpuset-cpus`, Kubernetes' static CPU manager) and of batch schedulers (Slurm),
// and mpirun's binding all narrow it, and two ranks held to one CPU that poll for each other lose
// their time slices to it (BENCHMARKS.md, "Ranks held to fewer CPUs than the host has"). The mask
// is the calling thread's, read when a group forms (the progress thread inherits it): threads
// pinned again later (an OpenMP runtime's binding) are not seen.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace shoal {

// This thread's CPUs in increasing order; empty if its mask cannot be read.
std::vector<int> allowed_cpus();
// This thread's affinity as a CPU list ("0-3,8,10-11", as /proc's Cpus_allowed_list): a few
// bytes for the usual sets, whatever the CPUs' numbers. The CPUs online where it cannot be read.
std::string affinity_text();
// How many CPUs are in the union of lists written by affinity_text() (at least 1; what does not
// parse adds none).
int cpus_in_union(const std::vector<std::string>& lists);
// How many CPUs this thread may run on, counted as cpus_in_union counts them.
inline int cpus_of_this_thread() { return cpus_in_union({affinity_text()}); }

// Where a waiting rank moves when a peer it waits for runs on its CPU `cpu` while the ranks have a
// CPU each (Engine::wait_loop): `last_cpu[r]` is 1 + the CPU rank r last waited on (0: unknown),
// `allowed` the CPUs this thread may run on, in increasing order. Of the ranks on `cpu` only the
// highest moves, so that two never move together; it moves to the first allowed CPU above `cpu`
// (then from the lowest) that no rank last waited on. -1: stay.
int cpu_to_move_to(int rank, int cpu, const std::vector<unsigned>& last_cpu, const std::vector<int>& allowed);
// Moves this thread to `cpu`, one of its mask's, and leaves its mask as it was; whether it moved.
bool move_this_thread_to(int cpu);

// One core's L2 cache in bytes, as the C library reads it from the CPU (sysconf); 0 where unknown.
// The ranks of a host may read different values (cores of two kinds, C libraries of two
// containers): what their ops cut by it is agreed when the group forms (algo::Ways::l2).
size_t l2_bytes();
// Makes l2_bytes() return `bytes` in this process (tests); a negative value reads the CPU again.
void set_l2_bytes_for_testing(long bytes);

}  // namespace shoal
