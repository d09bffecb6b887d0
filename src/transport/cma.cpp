#include "transport/cma.h"

#include <sys/uio.h>

#include <cerrno>

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

}  // namespace

int read(int pid, const void* remote, void* local, size_t n) {
  return transfer([pid](iovec* l, iovec* r) { return process_vm_readv(pid, l, 1, r, 1, 0); }, static_cast<uint8_t*>(local),
                  static_cast<uint8_t*>(const_cast<void*>(remote)), n);
}

int write(int pid, const void* local, void* remote, size_t n) {
  return transfer([pid](iovec* l, iovec* r) { return process_vm_writev(pid, l, 1, r, 1, 0); },
                  static_cast<uint8_t*>(const_cast<void*>(local)), static_cast<uint8_t*>(remote), n);
}

}  // namespace shoal::cma
