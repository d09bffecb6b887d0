// The harness of the small timing programs in scripts/: p ranks, each a forked process with its
// own Communicator over one FileStore, run `body(c, rank)`; the parent waits for them all and
// returns nonzero when one failed (a nonzero return from body, a signal).
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
  for (int r = 0; r < p; ++r) {
    if (fork() != 0) continue;
    int rc;
    {
      shoal::Communicator c(std::make_shared<shoal::FileStore>(path), r, p);
      rc = body(c, r);
      fflush(stdout);
    }
    _exit(rc);
  }
  int bad = 0, st = 0;
  for (int r = 0; r < p; ++r) {
    wait(&st);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  unlink(path.c_str());
  return bad;
}
