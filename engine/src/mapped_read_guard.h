// Reading a memory-mapped file that shrank after it was mapped faults: the pages past the new
// end are gone, and the kernel sends SIGBUS, which kills the process. A store's chunk files are
// replaced by rename (the mapping keeps the old file), but `cp` over a chunk, `truncate` or an
// rsync --inplace rewrite the file itself under a running training job.
//
// While a MappedReadGuard lives, such a fault in this thread's reads of its mapping does not
// kill the process: the missing page reads as zeros, the read goes on, and check() afterwards
// throws an InputError naming the file. check() also asks the file itself (MappedFile::shrunk):
// a cut inside a page reads zeros past it without any fault, and another thread reading the same
// mapping reads the zero page its guard's fault put there. Faults no guard of the faulting
// thread covers go to whatever handled SIGBUS before (the default: the process dies, as without
// the guard).
//
// The SIGBUS handler is installed by the first guard, not at load time, so that it chains to a
// handler installed after the library loaded (Python's faulthandler, a sanitizer's). A file
// that shrank and grew back before it was read reads its new contents: no guard can see that.
// Live guards are kept in a fixed table of slots (their thread, their mapping's range), which the
// handler scans: no thread-local storage, which a signal handler cannot safely touch in a module
// loaded with dlopen (the Python extension). With every slot taken (64 guards at once) a guard
// guards nothing: a fault then ends the process as before, and check() still asks the file.
#pragma once

#include <csignal>
#include <string>

#include "file_io.h"

namespace tandem {

class MappedReadGuard {
 public:
  // Guards this thread's reads of `mapped` (nothing to guard for an empty mapping). Guards nest
  // (a fault marks every guard of the thread whose mapping it is in).
  explicit MappedReadGuard(const MappedFile& mapped);
  ~MappedReadGuard();
  MappedReadGuard(const MappedReadGuard&) = delete;
  MappedReadGuard& operator=(const MappedReadGuard&) = delete;

  // True once a read of the mapping by this thread faulted: what it read of the missing pages
  // was zeros.
  bool faulted() const { return faulted_ != 0; }
  // Throws InputError "WHAT: the file 'PATH' shrank below its N mapped bytes while it was being
  // read ..." when a read faulted or the file is now shorter than its mapping; `what` says what
  // the file holds.
  void check(const std::string& what) const;

 private:
  friend struct MappedReadGuardAccess;  // the signal handler
  const MappedFile& mapped_;
  volatile sig_atomic_t faulted_ = 0;  // written by the signal handler, on this thread
  int slot_ = -1;                      // its slot in the table; -1: none (empty or table full)
};

}  // namespace tandem
