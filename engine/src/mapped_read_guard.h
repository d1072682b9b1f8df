// Reading a memory-mapped file that shrank after it was mapped faults: the pages past the new
// end are gone, and the kernel sends SIGBUS, which kills the process. A store's chunk files are
// replaced by rename (the mapping keeps the old file), but `cp` over a chunk, `truncate` or an
// rsync --inplace rewrite the file itself under a running training job.
//
// While a MappedReadGuard lives, such a fault in this thread's reads of its mapping does not
// kill the process: the missing page reads as zeros, the read goes on, and check() afterwards
// throws an InputError naming the file. Faults anywhere else, or in other threads, go to
// whatever handled SIGBUS before (the default: the process dies, as without the guard).
//
// The SIGBUS handler is installed by the first guard, not at load time, so that it chains to a
// handler installed after the library loaded (Python's faulthandler, a sanitizer's). A file
// that shrank and grew back before it was read reads its new contents: no guard can see that.
#pragma once

#include <string>

#include "file_io.h"

namespace tandem {

class MappedReadGuard {
 public:
  // Guards this thread's reads of `mapped` (nothing to guard for an empty mapping). Guards nest.
  explicit MappedReadGuard(const MappedFile& mapped);
  ~MappedReadGuard();
  MappedReadGuard(const MappedReadGuard&) = delete;
  MappedReadGuard& operator=(const MappedReadGuard&) = delete;

  // True once a read of the mapping faulted: what was read from the missing pages was zeros.
  bool faulted() const { return faulted_ != 0; }
  // Throws InputError "WHAT: the file 'PATH' shrank below its N mapped bytes while it was being
  // read ..." when a read faulted; `what` says what the file holds.
  void check(const std::string& what) const;

 private:
  friend struct MappedReadGuardAccess;  // the signal handler
  const MappedFile& mapped_;
  const char* begin_;
  const char* end_;
  volatile int faulted_ = 0;  // written by the signal handler, on this thread
  MappedReadGuard* outer_;    // the guard this one nests in
};

}  // namespace tandem
