// libFuzzer target: the TCP Link's receive path (src/transport/tcp_link.cpp): frame headers
// (link.h FrameHeader) and payloads arriving on its streams, cut into parts, against the receives
// posted; and the flow-control reports arriving on its control connection. The link gets
// socketpairs for its streams and its control connection; the input says how many streams, which
// receives are posted (size, op signature), whether more sends than the flow-control window are
// posted (so the link reads the reports), and then the bytes the peer writes, as records
// {u8 connection (stream, or the control connection after the last stream), u8 length, bytes}.
// The peer's ends are closed after that, so every request must complete or fail with PeerError:
// no crash, no write outside the posted buffers, no hang.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "shoal/error.h"
#include "transport/link.h"
#include "transport/tcp_link.h"

namespace {

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint64_t le(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(u8()) << (8 * i);
    return v;
  }
};

constexpr size_t kGuard = 64;  // poisoned-by-pattern bytes after each receive buffer

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  uint8_t b0 = in.u8();
  int nstreams = 1 + b0 % 4;
  bool large = b0 & 0x80;  // receives big enough to be cut into parts (slower: fuzz them less often)
  bool sends = b0 & 0x40;  // post more sends than the window, so the reports are read
  int nreq = in.u8() % 4;  // 0: only peek
  std::vector<int> mine, theirs;  // [nstreams]: the control connection
  for (int s = 0; s <= nstreams; ++s) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    mine.push_back(sv[0]);
    theirs.push_back(sv[1]);
  }
  const int control = mine.back();
  mine.pop_back();
  std::unique_ptr<shoal::Link> link = shoal::make_tcp_link(1, mine, control);

  std::vector<std::vector<uint8_t>> bufs(nreq);
  std::vector<shoal::Request> reqs(nreq);
  for (int i = 0; i < nreq; ++i) {
    size_t bytes = large ? in.le(3) % (1u << 20) : in.le(3) % 4096;
    bufs[i].assign(bytes + kGuard, 0xee);
    reqs[i] = shoal::Request{shoal::Request::Dir::recv, 1, bufs[i].data(), bytes, in.le(8), "fuzz", 0, 0, false};
  }
  // The peer's bytes.
  while (in.n > 0) {
    int s = in.u8() % (nstreams + 1);
    size_t len = std::min<size_t>(in.u8(), in.n);
    if (len == 0) continue;
    (void)!::send(theirs[s], in.p, len, MSG_DONTWAIT | MSG_NOSIGNAL);  // a full buffer drops bytes
    in.p += len;
    in.n -= len;
  }
  for (int fd : theirs) ::close(fd);

  shoal::FrameHeader h;
  (void)link->peek(&h);
  for (auto& r : reqs) link->post(&r);
  std::vector<shoal::Request> sreqs(sends ? shoal::kTcpWindow + 8 : 0);
  for (auto& r : sreqs) {
    r = shoal::Request{shoal::Request::Dir::send, 1, nullptr, 0, 1, "fuzz", 0, 0, false};
    link->post(&r);
  }
  try {
    for (long i = 0; link->busy(); ++i) {
      if (!link->progress() && i > 1000000) {
        std::fprintf(stderr, "fuzz_tcp_frames: the link neither moves nor fails with its peer gone\n");
        std::abort();
      }
    }
    for (auto& r : reqs)
      if (!r.complete || r.done != r.bytes) std::abort();  // completed means fully received
    for (auto& r : sreqs)
      if (!r.complete) std::abort();
  } catch (const shoal::PeerError&) {
    // Expected for almost every input: a corrupt or mismatched frame, or the closed peer.
  }
  for (int i = 0; i < nreq; ++i)
    for (size_t k = 0; k < kGuard; ++k)
      if (bufs[i][reqs[i].bytes + k] != 0xee) std::abort();  // nothing written past the buffer
  link->close();
  return 0;
}
