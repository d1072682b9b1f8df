#include "mapped_read_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>

#include "tandem/error.h"

namespace tandem {

struct MappedReadGuardAccess {
  // The innermost guard of this thread. Initial-exec: the handler may be the first to read it
  // in a thread, and a shared library's other thread-locals may be allocated on first access,
  // which is not safe in a signal handler.
  static thread_local MappedReadGuard* innermost __attribute__((tls_model("initial-exec")));

  static bool covers(const MappedReadGuard* guard, const char* address) {
    return address >= guard->begin_ && address < guard->end_;
  }
  static MappedReadGuard* outer(const MappedReadGuard* guard) { return guard->outer_; }
  static void mark_faulted(MappedReadGuard* guard) { guard->faulted_ = 1; }
};

thread_local MappedReadGuard* MappedReadGuardAccess::innermost
    __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

struct sigaction previous_action;  // what handled SIGBUS before the first guard
std::once_flag install_once;

// Hands a SIGBUS that no guard claims to what handled it before. For the default action (or an
// ignored signal, which a fault cannot be), that is restoring it: returning re-runs the faulting
// instruction, which faults again and ends the process as it would have without the guard; a
// SIGBUS sent by kill() is raised again, to be delivered once the handler returns.
void pass_on(int signal, siginfo_t* info, void* context) {
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction != nullptr) {
      previous_action.sa_sigaction(signal, info, context);
      return;
    }
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal);
    return;
  }
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(signal, &fallback, nullptr);
  if (info->si_code <= 0) ::raise(signal);  // sent, not a fault
}

void on_sigbus(int signal, siginfo_t* info, void* context) {
  const char* address = static_cast<const char*>(info->si_addr);
  MappedReadGuard* guard = MappedReadGuardAccess::innermost;
  for (; guard != nullptr; guard = MappedReadGuardAccess::outer(guard)) {
    if (MappedReadGuardAccess::covers(guard, address)) break;
  }
  if (info->si_code != BUS_ADRERR || guard == nullptr) {
    pass_on(signal, info, context);
    return;
  }
  // A zero page over the missing one: the read that faulted runs again and reads zeros. The raw
  // system call, not mmap(): a sanitizer's interceptor is not meant to run in a signal handler.
  const uintptr_t page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(address) & ~(page_size - 1));
  const long mapped = ::syscall(SYS_mmap, page, page_size, PROT_READ,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (mapped == -1) {  // out of mappings: nothing left but to die of the fault
    pass_on(signal, info, context);
    return;
  }
  MappedReadGuardAccess::mark_faulted(guard);
}

void install_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (::sigaction(SIGBUS, &action, &previous_action) != 0)
    throw Error("cannot install the SIGBUS handler that guards reads of mapped files");
}

}  // namespace

MappedReadGuard::MappedReadGuard(const MappedFile& mapped)
    : mapped_(mapped),
      begin_(reinterpret_cast<const char*>(mapped.data())),
      end_(begin_ == nullptr ? nullptr : begin_ + mapped.size()),
      outer_(MappedReadGuardAccess::innermost) {
  std::call_once(install_once, install_handler);
  MappedReadGuardAccess::innermost = this;
}

MappedReadGuard::~MappedReadGuard() { MappedReadGuardAccess::innermost = outer_; }

void MappedReadGuard::check(const std::string& what) const {
  if (!faulted()) return;
  throw InputError(what + ": the file '" + mapped_.path() + "' shrank below its " +
                   std::to_string(mapped_.size()) +
                   " mapped bytes while it was being read, so what was read is not its "
                   "contents. Something rewrote it in place (cp onto a file does; Tandem and "
                   "zarr-python write a new file and rename it); read it again once it is whole");
}

}  // namespace tandem
