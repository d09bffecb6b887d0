// shoal reports failure with exceptions derived from shoal::Error (one way, everywhere in C++).
#pragma once
#include <stdexcept>
#include <string>

namespace shoal {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Bad arguments from the caller: invalid rank, null buffer, unknown dtype, unsupported op.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
// An op did not finish before its deadline.
class Timeout : public Error {
 public:
  using Error::Error;
};
// A peer died, closed its connection, aborted, or the ranks called mismatched ops.
// After this error the communicator is aborted: every pending and later op fails.
class PeerError : public Error {
 public:
  using Error::Error;
};

}  // namespace shoal
