#include "transport/cma.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>

#include "reduce/copy.h"

namespace shoal::cma {

bool probe(int pid, uint64_t addr, uint64_t expect) {
  uint64_t got = ~expect;
  return read(pid, reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), &got, sizeof got) == 0 && got == expect;
}

namespace {

// process_vm_readv or process_vm_writev of n bytes, repeated while the kernel copies less than
// asked (it stops at a fault, or at its limit).
template <class Call>
int transfer(Call call, uint8_t* local, uint8_t* remote, size_t n) {
  while (n > 0) {
    iovec l{local, n}, r{remote, n};
    const ssize_t done = call(&l, &r);
    if (done < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (done == 0) return EFAULT;
    local += done;
    remote += done;
    n -= static_cast<size_t>(done);
  }
  return 0;
}

// A transfer whose two addresses lie a few bytes apart in their pages (reduce/copy.h) goes in
// pieces this large through a buffer of this thread's, placed at the remote address's offset in a
// page: the kernel then copies at distance 0, and copy_bytes makes the other leg of the copy by
// its vector loop. Two copies of a piece that stays in the cache take 2-4x less time than the
// kernel's one.
constexpr size_t kBouncePiece = size_t(256) << 10;

uint8_t* bounce_at(const uint8_t* remote) {
  static thread_local std::unique_ptr<uint8_t, decltype(&std::free)> buf(
      static_cast<uint8_t*>(std::aligned_alloc(4096, kBouncePiece + 4096)), &std::free);
  return buf ? buf.get() + (reinterpret_cast<uintptr_t>(remote) & 4095) : nullptr;
}

}  // namespace

int read(int pid, const void* remote, void* local, size_t n) {
  auto call = [pid](iovec* l, iovec* r) { return process_vm_readv(pid, l, 1, r, 1, 0); };
  auto* from = static_cast<uint8_t*>(const_cast<void*>(remote));
  auto* to = static_cast<uint8_t*>(local);
  uint8_t* b = n >= kShortDistanceFrom && short_page_distance(to, from) && bounce_short_distances() ? bounce_at(from) : nullptr;
  if (!b) return transfer(call, to, from, n);
  for (size_t off = 0; off < n; off += kBouncePiece) {
    const size_t len = std::min(kBouncePiece, n - off);
    if (const int e = transfer(call, b, from + off, len)) return e;
    copy_bytes(to + off, b, len);
  }
  return 0;
}

int write(int pid, const void* local, void* remote, size_t n) {
  auto call = [pid](iovec* l, iovec* r) { return process_vm_writev(pid, l, 1, r, 1, 0); };
  auto* from = static_cast<uint8_t*>(const_cast<void*>(local));
  auto* to = static_cast<uint8_t*>(remote);
  uint8_t* b = n >= kShortDistanceFrom && short_page_distance(to, from) && bounce_short_distances() ? bounce_at(to) : nullptr;
  if (!b) return transfer(call, from, to, n);
  for (size_t off = 0; off < n; off += kBouncePiece) {
    const size_t len = std::min(kBouncePiece, n - off);
    copy_bytes(b, from + off, len);
    if (const int e = transfer(call, b, to + off, len)) return e;
  }
  return 0;
}

}  // namespace shoal::cma
