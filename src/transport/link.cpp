// The message of a mismatched frame (link.h), the same on the links that use it.
#include "transport/link.h"

namespace shoal {

std::string frame_mismatch(const Request& r, int peer, const FrameHeader& h) {
  return std::string(r.what) + ": rank " + std::to_string(peer) + " sent a " + std::to_string(h.bytes) +
         "-byte message for a different call (signature " + std::to_string(h.sig) + ") but this rank expects " +
         std::to_string(r.bytes) + " bytes (signature " + std::to_string(r.sig) +
         "): the ranks called mismatched ops (op, count, dtype, root, tag or algorithm differ)";
}

}  // namespace shoal
