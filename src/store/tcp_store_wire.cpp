// The parsing of TcpStore's requests (store_request.h), apart from the server's sockets.
#include "store/tcp_store_wire.h"

namespace shoal::store_wire {

bool next_frame(const uint8_t* p, size_t n, size_t* frame_bytes, std::string* err) {
  *frame_bytes = 0;
  if (n < 4) return true;
  uint32_t len = get32(p);
  if (len > kMaxFrame) {
    *err = "frame of " + std::to_string(len) + " bytes exceeds the 64 MiB limit";
    return false;
  }
  if (len < kHeader - 4) {
    *err = "frame too short";
    return false;
  }
  if (n - 4 >= len) *frame_bytes = 4 + size_t(len);
  return true;
}

std::string parse_request(const uint8_t* p, size_t n, Request* out) {
  if (n < kHeader - 4) return "frame too short";
  out->cmd = p[0];
  out->id = get32(p + 1);
  FrameReader r(p + 5, n - 5);
  switch (out->cmd) {
    case kHello:
      out->magic = r.u32();
      out->version = r.u32();
      if (out->magic != kMagic) return "bad HELLO (not a shoal store client?)";
      if (out->version != kVersion) return "";  // answered with the version mismatch; its body may differ
      out->key = r.str();                       // the token
      if (!r.at_end() || out->key.size() > kMaxToken) return "bad HELLO (malformed token)";
      return "";
    case kSet:
      out->key = r.str();
      out->value = r.bytes();
      return r.at_end() ? "" : "malformed SET";
    case kGet:
      out->timeout_ms = r.i64();
      out->key = r.str();
      return r.at_end() ? "" : "malformed GET";
    case kWait:
      out->timeout_ms = r.i64();
      out->keys = r.keys();
      return r.at_end() ? "" : "malformed WAIT";
    case kAdd:
      out->key = r.str();
      out->delta = r.i64();
      return r.at_end() ? "" : "malformed ADD";
    case kCheck:
      out->key = r.str();
      return r.at_end() ? "" : "malformed CHECK";
  }
  return "unknown command " + std::to_string(out->cmd);
}

}  // namespace shoal::store_wire
