// The TcpStore server's request parsing, apart from its sockets, so that it can be tested and
// fuzzed on its own (tests/fuzz/fuzz_store_request.cpp). The wire protocol is described in
// tcp_store_wire.h; tcp_store_wire.cpp implements these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shoal/store.h"

namespace shoal::store_wire {

// One decoded request frame; which fields are set depends on cmd.
struct Request {
  uint8_t cmd = 0;
  uint32_t id = 0;
  uint32_t magic = 0, version = 0;  // HELLO
  std::string key;                  // SET, GET, ADD, CHECK; HELLO: the token
  Bytes value;                      // SET
  int64_t timeout_ms = 0;           // GET, WAIT
  int64_t delta = 0;                // ADD
  std::vector<std::string> keys;    // WAIT
};

// The next frame of a client's stream [p, p + n): false (and *err) when its length field is out of
// bounds; else true, with *frame_bytes its whole size (length field included) once all of it is in
// [p, p + n), 0 while it is not.
bool next_frame(const uint8_t* p, size_t n, size_t* frame_bytes, std::string* err);

// Decodes a frame's payload (the bytes after its length field). "" when it is a well-formed request,
// else why not (the server drops the connection).
std::string parse_request(const uint8_t* p, size_t n, Request* out);

}  // namespace shoal::store_wire
