#include "transport/fd_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"

namespace shoal {
namespace {

// Descriptors left free for what the process opens after the group is made (files, a store
// client, another group's set-up).
constexpr size_t kMargin = 64;

}  // namespace

size_t open_fd_count() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  size_t n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n > 0 ? n - 1 : 0;  // less the directory's own descriptor
}

std::string make_fd_room(size_t more, const std::string& what, const std::string& hint) {
  rlimit lim{};
  if (more == 0 || getrlimit(RLIMIT_NOFILE, &lim) != 0) return "";
  const size_t open_now = open_fd_count();
  const size_t need = open_now + more;
  // The margin is asked for, not required: a hard limit between need and need + margin still fits.
  const size_t want = need + kMargin;
  if (lim.rlim_cur == RLIM_INFINITY || want <= lim.rlim_cur) return "";
  const rlim_t soft = lim.rlim_cur;
  if (lim.rlim_max == RLIM_INFINITY || need <= lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? static_cast<rlim_t>(want)
                                                     : std::min<rlim_t>(lim.rlim_max, static_cast<rlim_t>(want));
    if (raised.rlim_cur > soft && setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      SHOAL_LOG(info, "raised the soft RLIMIT_NOFILE from %llu to %llu for %s", static_cast<unsigned long long>(soft),
                static_cast<unsigned long long>(raised.rlim_cur), what.c_str());
      return "";
    }
    if (need <= soft) return "";  // no room for the margin, but room for the need
  }
  return what + " needs " + std::to_string(more) + " file descriptors, with " + std::to_string(open_now) +
         " open already, but RLIMIT_NOFILE allows " + std::to_string(soft) + " (hard limit " +
         (lim.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_max)) +
         "): raise it (`ulimit -n " + std::to_string(want) + "`, LimitNOFILE= in systemd, --ulimit nofile= in "
         "Docker)" + (hint.empty() ? "" : " or " + hint);
}

}  // namespace shoal
