// Room for the file descriptors a rank's links need.
//
// A TCP peer costs tcp_streams + 1 descriptors (data streams and the control connection), a
// shared-memory peer 1 (the pidfd that shows its death), so a full mesh of a thousand ranks passes
// the soft RLIMIT_NOFILE most systems start processes with (1,024). Before a group opens them a
// rank raises its soft limit (to what it needs plus a margin, at most the hard limit), as Ray and
// Open MPI do; where even the hard limit is too low it fails with an error that names the limit,
// the need and the fix, rather than with EMFILE half-way through connecting.
#pragma once
#include <string>

namespace shoal {

// Makes room for `more` descriptors beyond those open now (plus a margin for the caller's own
// use). Returns an empty string on success, or the error to report. `what` names the need; `hint`,
// if not empty, is another way to need fewer.
std::string make_fd_room(size_t more, const std::string& what, const std::string& hint);

// Descriptors this process has open (entries of /proc/self/fd).
size_t open_fd_count();

}  // namespace shoal
