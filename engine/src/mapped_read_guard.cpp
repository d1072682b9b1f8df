#include "mapped_read_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "tandem/error.h"

namespace tandem {

struct MappedReadGuardAccess {
  static void mark_faulted(MappedReadGuard* guard) { guard->faulted_ = 1; }
};

namespace {

// A live guard: its thread (kernel thread id; 0 for a free slot), its mapping's range, and the
// guard itself. Lock-free atomics only, so the handler may read them.
struct Slot {
  std::atomic<pid_t> thread{0};
  std::atomic<const char*> begin{nullptr}, end{nullptr};
  std::atomic<MappedReadGuard*> guard{nullptr};
};
constexpr int kSlots = 64;
Slot slots[kSlots];

pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }  // signal-safe

struct sigaction previous_action;  // what handled SIGBUS before the first guard
std::once_flag install_once;

// Hands a SIGBUS that no guard claims to what handled it before. A sent SIGBUS that was ignored
// stays ignored. Otherwise, for the default action (a fault cannot be ignored), the default is
// restored: returning re-runs the faulting instruction, which faults again and ends the process
// as it would have without the guard; a sent SIGBUS is raised again, to be delivered once the
// handler returns.
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
  const bool sent = info->si_code <= 0;  // by kill() or raise(), not a fault
  if (sent && previous_action.sa_handler == SIG_IGN) return;  // ignored, as it was
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(signal, &fallback, nullptr);
  if (sent) ::raise(signal);
}

void on_sigbus(int signal, siginfo_t* info, void* context) {
  const char* address = static_cast<const char*>(info->si_addr);
  const pid_t thread = this_thread_id();
  MappedReadGuard* covering[kSlots];
  int found = 0;
  if (info->si_code == BUS_ADRERR) {
    for (Slot& slot : slots)
      if (slot.thread.load() == thread && address >= slot.begin.load() &&
          address < slot.end.load())
        covering[found++] = slot.guard.load();
  }
  if (found == 0) {
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
  for (int i = 0; i < found; ++i) MappedReadGuardAccess::mark_faulted(covering[i]);
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

MappedReadGuard::MappedReadGuard(const MappedFile& mapped) : mapped_(mapped) {
  if (mapped.data() == nullptr || mapped.size() == 0) return;
  std::call_once(install_once, install_handler);
  const pid_t thread = this_thread_id();
  for (int i = 0; i < kSlots; ++i) {
    pid_t free = 0;
    if (!slots[i].thread.compare_exchange_strong(free, thread)) continue;
    // Only this thread's handler reads the slot once it is this thread's, and it runs on this
    // thread: the stores are seen in program order.
    const char* begin = reinterpret_cast<const char*>(mapped.data());
    slots[i].begin.store(begin);
    slots[i].end.store(begin + mapped.size());
    slots[i].guard.store(this);
    slot_ = i;
    return;
  }
}

MappedReadGuard::~MappedReadGuard() {
  if (slot_ < 0) return;
  Slot& slot = slots[slot_];
  slot.guard.store(nullptr);
  slot.end.store(nullptr);
  slot.begin.store(nullptr);
  slot.thread.store(0);
}

void MappedReadGuard::check(const std::string& what) const {
  if (!faulted() && !mapped_.shrunk()) return;
  throw InputError(what + ": the file '" + mapped_.path() + "' shrank below its " +
                   std::to_string(mapped_.size()) +
                   " mapped bytes while it was being read, so what was read is not its "
                   "contents. Something rewrote it in place (cp onto a file does; Tandem and "
                   "current zarr-python write a new file and rename it); read it again once it "
                   "is whole");
}

}  // namespace tandem
