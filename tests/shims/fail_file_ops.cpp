// LD_PRELOAD shim for tests: rename() and renameat() onto a path that ends with
// $TANDEM_TEST_FAIL_RENAME_TO fail with ENOSPC, as on a full disk, and remove() of a path that
// ends with $TANDEM_TEST_FAIL_REMOVE_OF fails with EACCES; everything else is done. It lets a
// test reach the failure of one file operation of a real process (tandem search's copy of the
// best checkpoint, its removal of a trial's old metrics) without filling a disk or dropping
// privileges.
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace {

bool refused(const char* path, const char* variable = "TANDEM_TEST_FAIL_RENAME_TO") {
  const char* suffix = std::getenv(variable);
  if (suffix == nullptr || *suffix == '\0' || path == nullptr) return false;
  const size_t n = std::strlen(path), m = std::strlen(suffix);
  return n >= m && std::strcmp(path + n - m, suffix) == 0;
}

template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" int rename(const char* from, const char* to) {
  if (refused(to)) {
    errno = ENOSPC;
    return -1;
  }
  return next<int (*)(const char*, const char*)>("rename")(from, to);
}

extern "C" int renameat(int from_dir, const char* from, int to_dir, const char* to) {
  if (refused(to)) {
    errno = ENOSPC;
    return -1;
  }
  return next<int (*)(int, const char*, int, const char*)>("renameat")(from_dir, from, to_dir, to);
}

extern "C" int remove(const char* path) {
  if (refused(path, "TANDEM_TEST_FAIL_REMOVE_OF")) {
    errno = EACCES;
    return -1;
  }
  return next<int (*)(const char*)>("remove")(path);
}
