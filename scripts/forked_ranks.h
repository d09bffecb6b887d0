// The harness of the small timing programs in scripts/: p ranks, each a forked process with its
// own Communicator over one FileStore, run `body(c, rank)`; the parent waits for them all and
// returns nonzero when one failed (a nonzero return from body, a signal) or could not start.
#pragma once
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <memory>
#include <string>
#include "shoal/communicator.h"
#include "shoal/store.h"

template <class Body>
int run_forked_ranks(int p, const char* tag, Body body) {
  const std::string path = std::string("/tmp/") + tag + "-store-" + std::to_string(getpid());
  int started = 0, bad = 0;
  for (int r = 0; r < p; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      bad = 1;
      break;
    }
    if (pid > 0) {
      ++started;
      continue;
    }
    int rc;
    {
      shoal::Communicator c(std::make_shared<shoal::FileStore>(path), r, p);
      rc = body(c, r);
      fflush(stdout);
    }
    _exit(rc);
  }
  for (int st = 0; started > 0; --started)
    bad |= wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  unlink(path.c_str());
  return bad;
}
