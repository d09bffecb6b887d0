// Writes to memory after a pause: maps 16 MiB of shared memory (as a group's scratch is mapped),
// writes all of it in pieces of 16 KiB, then again at once, then again after a pause of PAUSE_MS,
// and prints for each pass how many pieces took more than 50 µs, the slowest, and the pass's time.
// On a machine whose memory is simply memory, every pass after the first takes the same time; a
// virtual machine whose host write-protects guest pages it has not seen written for a while (to
// track what the guest dirties) makes the first write to each page after a pause cost a trap to
// the host (BENCHMARKS.md, "Writes after a pause").
//
//   gcc -O2 -o /tmp/write_after_pause scripts/write_after_pause.c
//   /tmp/write_after_pause PAUSE_MS
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pass(const char* what, uint8_t* p, size_t bytes, const uint8_t* src, size_t piece) {
  int slow = 0;
  double most = 0, t0 = now_us();
  for (size_t o = 0; o < bytes; o += piece) {
    const double a = now_us();
    memcpy(p + o, src, piece);
    const double us = now_us() - a;
    slow += us > 50;
    if (us > most) most = us;
  }
  printf("%-26s %4d of %zu pieces over 50 us, slowest %6.0f us, pass %8.0f us\n", what, slow, bytes / piece, most,
         now_us() - t0);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PAUSE_MS\n", argv[0]);
    return 2;
  }
  const long pause_ms = atol(argv[1]);
  const size_t bytes = (size_t)16 << 20, piece = (size_t)16 << 10;
  const int fd = memfd_create("write_after_pause", 0);
  if (fd < 0 || posix_fallocate(fd, 0, (off_t)bytes) != 0) {
    perror("memfd_create/posix_fallocate");
    return 1;
  }
  uint8_t* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  uint8_t* src = aligned_alloc(64, piece);
  if (p == MAP_FAILED || !src) {
    perror("mmap");
    return 1;
  }
  memset(src, 7, piece);
  pass("first (maps the pages)", p, bytes, src, piece);
  pass("again at once", p, bytes, src, piece);
  usleep((useconds_t)(pause_ms * 1000));
  char what[64];
  snprintf(what, sizeof what, "again after %ld ms", pause_ms);
  pass(what, p, bytes, src, piece);
  pass("again at once", p, bytes, src, piece);
  return 0;
}
