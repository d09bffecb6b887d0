// libFuzzer target: the TcpStore server's request parsing (src/store/store_request.h). The input is
// what a client wrote on its connection: it is split into frames as the server splits a client's
// stream, and each frame is decoded. Nothing may crash, read out of bounds, allocate more than the
// frame holds, or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "store/store_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t off = 0;
  while (off < size) {
    size_t frame = 0;
    std::string err;
    if (!shoal::store_wire::next_frame(data + off, size - off, &frame, &err)) {
      if (err.empty()) std::abort();  // a refused frame says why
      break;
    }
    if (frame == 0) break;                                  // incomplete: the server waits for more
    if (frame < 4 + 5 || frame > size - off) std::abort();  // a frame is a header and lies in the stream
    shoal::store_wire::Request q;
    std::string bad = shoal::store_wire::parse_request(data + off + 4, frame - 4, &q);
    if (bad.empty()) {
      // Whatever was decoded came out of the frame.
      size_t total = q.key.size() + q.value.size();
      for (auto& k : q.keys) total += k.size() + 4;
      if (total > frame) std::abort();
    }
    off += frame;
  }
  return 0;
}
