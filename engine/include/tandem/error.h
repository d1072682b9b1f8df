// Tandem's one error policy: engine code throws a tandem::Error (or a subclass) whose message
// names what failed, where (a file or a parameter) and the bad value next to what was expected.
#pragma once

#include <stdexcept>
#include <string>
#include "tandem/export.h"

namespace tandem {

// Base of every exception the engine throws. Callers that only want a message catch this.
class TANDEM_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a file in the wrong format, a shape that does not match, a value out of range.
class TANDEM_API InputError : public Error {
 public:
  using Error::Error;
};

// An operating-system level failure (open, read, write, rename, fsync), with errno's text.
class TANDEM_API IoError : public Error {
 public:
  using Error::Error;
};

}  // namespace tandem
