// The CPUs a process may run on, and how many the ranks of one host have between them: what
// decides whether a waiting rank polls (each rank has a CPU) or hands its CPU over at once (ranks
// outnumber the CPUs they may use).
//
// The affinity mask, not the CPUs online: taskset, numactl, the cpusets of containers
// (`docker --cpuset-cpus`, Kubernetes' static CPU manager) and of batch schedulers (Slurm), and
// mpirun's binding all narrow it, and two ranks held to one CPU that poll for each other lose
// their time slices to it (BENCHMARKS.md, "Ranks held to fewer CPUs than the host has").
#pragma once
#include <string>
#include <vector>

namespace shoal {

// This process's affinity as hexadecimal digits, CPU 0 in the lowest bit of the last digit (as
// /proc's Cpus_allowed, without commas); the CPUs online where the affinity cannot be read.
std::string affinity_text();
// How many CPUs are in the union of masks written by affinity_text() (at least 1).
int cpus_in_union(const std::vector<std::string>& masks);

}  // namespace shoal
