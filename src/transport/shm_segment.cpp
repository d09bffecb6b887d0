#include "transport/shm_segment.h"

#include <algorithm>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/log.h"
#include "shoal/error.h"
#include "transport/futex.h"

namespace shoal {
namespace {
// "SHOALSG" and the layout's version (5: the CPU a rank last waited on, in ShmControl): a peer of
// another build fails the check instead of misreading the block.
constexpr uint64_t kSegMagic = 0x53484f414c534705ull;
constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
size_t control_bytes() { return round_up(sizeof(ShmControl), kPage); }
size_t ring_stride(size_t ring_bytes) { return round_up(sizeof(ShmRing) + ring_bytes, kPage); }
size_t total_bytes(int size, size_t ring_bytes, size_t scratch_bytes) {
  return control_bytes() + size * ring_stride(ring_bytes) + round_up(scratch_bytes, kPage);
}
std::string errno_text() { return std::strerror(errno); }

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1 << 20));
  return b;
}

std::string no_room_message(size_t bytes, int slots) {
  std::string free_text = "an unknown amount";
  struct statvfs v;
  if (statvfs("/dev/shm", &v) == 0)
    free_text = mib(static_cast<double>(v.f_bavail) * v.f_frsize) + " of " + mib(static_cast<double>(v.f_blocks) * v.f_frsize);
  return "not enough shared memory: this rank's segment needs " + mib(static_cast<double>(bytes)) + " of /dev/shm (" +
         std::to_string(slots) + " ranks on this host: about " + mib(static_cast<double>(bytes) * slots) +
         " in all), and " + free_text + " is free. Give /dev/shm more room (containers often get 64 MiB: docker run "
         "--shm-size=1g), leave more of it free (Ray's object store lives there too), or set SHOAL_TRANSPORT=tcp";
}
}  // namespace

std::string ShmControl::aborted_message(int owner) const {
  return "rank " + std::to_string(owner) + " aborted: " + std::string(reason, strnlen(reason, sizeof reason));
}

namespace {
// This process's PID namespace (its inode): a pid in a segment's name means something only there.
unsigned long pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long>(st.st_ino) : 0;
}
}  // namespace

std::string ShmSegment::make_name(int pid, const std::string& group_id, int rank) {
  return "/shoal-" + std::to_string(pid) + "-n" + std::to_string(pid_namespace()) + "-" + group_id + "-" +
         std::to_string(rank);
}

size_t ShmSegment::bytes_for(int slots, size_t ring_bytes, size_t scratch_bytes) {
  return total_bytes(slots, ring_bytes, scratch_bytes);
}

ShmSegment ShmSegment::create(const std::string& name, int size, size_t ring_bytes, size_t scratch_bytes,
                              uint64_t nonce) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw Error("shm_open(" + name + ") failed: " + errno_text());
  size_t bytes = total_bytes(size, ring_bytes, scratch_bytes);
  // posix_fallocate, not ftruncate alone: a sparse segment would take its pages at first touch,
  // and a full /dev/shm then kills the process with SIGBUS in the middle of an op.
  int e = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : errno;
  if (e != 0) {
    close(fd);
    shm_unlink(name.c_str());
    if (e == ENOSPC || e == EFBIG || e == ENOMEM) throw Error(no_room_message(bytes, size));
    throw Error("reserving " + std::to_string(bytes) + " bytes for shared segment " + name + " failed: " + std::strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw Error("mmap of shared segment " + name + " failed: " + errno_text());
  }
  ShmSegment s;
  s.base_ = static_cast<uint8_t*>(p);
  s.bytes_ = bytes;
  s.name_ = name;
  s.owner_ = true;
  auto* c = new (p) ShmControl();
  c->nonce = nonce;
  c->pid = getpid();
  c->self_addr = reinterpret_cast<uintptr_t>(c);
  c->size = size;
  c->ring_bytes = ring_bytes;
  c->scratch_bytes = scratch_bytes;
  for (int r = 0; r < size; ++r) new (s.ring(r)) ShmRing();
  std::atomic_thread_fence(std::memory_order_release);
  __atomic_store_n(&c->magic, kSegMagic, __ATOMIC_RELEASE);
  return s;
}

ShmSegment ShmSegment::open_existing(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw Error("shm_open(" + name + ") failed: " + errno_text());
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || static_cast<size_t>(st.st_size) < sizeof(ShmControl)) {
    close(fd);
    throw Error("shared segment " + name + " is not a shoal segment of this user");
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw Error("mmap of shared segment " + name + " failed: " + errno_text());
  ShmSegment s;
  s.base_ = static_cast<uint8_t*>(p);
  s.bytes_ = st.st_size;
  s.name_ = name;
  auto* c = s.control();
  if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != kSegMagic ||
      total_bytes(c->size, c->ring_bytes, c->scratch_bytes) != s.bytes_)
    throw Error("shared segment " + name + " has an unexpected layout");
  return s;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    base_ = o.base_;
    bytes_ = o.bytes_;
    name_ = std::move(o.name_);
    owner_ = o.owner_;
    o.base_ = nullptr;
    o.owner_ = false;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (owner_) unlink();
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
}

void ShmSegment::unlink() {
  if (owner_ && !name_.empty()) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

ShmRing* ShmSegment::ring(int from) const {
  return reinterpret_cast<ShmRing*>(base_ + control_bytes() + from * ring_stride(control()->ring_bytes));
}

uint8_t* ShmSegment::ring_data(int from) const { return reinterpret_cast<uint8_t*>(ring(from)) + sizeof(ShmRing); }

uint8_t* ShmSegment::scratch() const {
  return base_ + control_bytes() + control()->size * ring_stride(control()->ring_bytes);
}

void ShmSegment::remove_stale_segments() {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    int pid = 0, at = 0;
    unsigned long ns = pid_namespace();  // names without one (earlier releases): taken as this one's
    if (std::sscanf(e->d_name, "shoal-%d-%n", &pid, &at) != 1 || pid <= 0 || at == 0) continue;
    if (e->d_name[at] == 'n' && std::sscanf(e->d_name + at, "n%lu-", &ns) != 1) continue;
    // Another PID namespace's pid (a container sharing /dev/shm) cannot be judged from here.
    if (ns != pid_namespace()) continue;
    if (kill(pid, 0) == 0 || errno == EPERM) continue;  // still running (or not ours to judge)
    std::string name = std::string("/") + e->d_name;
    if (shm_unlink(name.c_str()) == 0) SHOAL_LOG(info, "removed stale shared segment %s", name.c_str());
  }
  closedir(d);
}

// The owner raises `sleeping` and fences before its last look at what it waits for (Engine::sleep).
// ring() has no fence: it would hold the caller until its news reached the owner's cache (a round
// trip between cores, the quarter of a 2-rank broadcast's time that its root spent there). Without
// it ring()'s load may pass the caller's news stores and read the flag down just as it goes up,
// while the owner's last look misses the news still on its way; so the owner's first sleep after
// raising the flag lasts at most the engine's kRaiseWindow, after which the news is there. A flag
// up for longer is seen by that load, and the doorbell's bump here (a locked instruction) makes the
// news visible before the owner wakes. An owner that is awake is not rung: a bump of its doorbell
// would pull the line it polls away from its core for nothing.
void ShmControl::wake_owner() {
  doorbell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&doorbell);
}

}  // namespace shoal
