// POSIX file helpers shared by the engine's readers and writers (safetensors checkpoints, Zarr
// chunks and metadata, dataset stores, PNGs): an owned descriptor, a temporary file removed on
// failure, read/write loops that retry interrupted calls, and the durable atomic replacement of
// a file (write a temporary file, fsync it, close it, rename it over the target, fsync the
// directory). Internal to tandem_engine; failures are IoError, with errno's text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace tandem {

// Owns a file descriptor so that every throw closes it.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  // Closes now and returns close()'s result: some filesystems report failed writes only here.
  int close();
  // Gives the descriptor up without closing it (to fdopen, say) and returns it.
  int release();

 private:
  int fd_;
};

// Unlinks the temporary file on every failure path, so a failed write leaves nothing behind.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  ~TempFileGuard();
  void dismiss() { path_.clear(); }

 private:
  std::string path_;
};

// Throws IoError "cannot ACTION 'PATH': <strerror(err)>".
[[noreturn]] void io_error(const std::string& action, const std::string& path, int err);

// Reads exactly n bytes. A read error is an IoError naming `path`; a file that ends first is the
// caller's kind of corruption: an InputError with `early_end_message`.
void read_exact(int fd, void* buf, size_t n, const std::string& path,
                const std::string& early_end_message);

// Writes all n bytes (write() may write fewer); an error is an IoError naming `path`.
void write_all(int fd, const void* buf, size_t n, const std::string& path);

// `path` without the slashes at its end, but the root's: "p.zarr/" names p.zarr, and a name
// made from it ("p.zarr/" + ".lock") must land beside it, not inside.
std::string without_trailing_slashes(std::string path);

// The directory part of `path`: "." for a bare name, "/" for a file in the root.
std::string parent_directory(const std::string& path);

// `path` made absolute, with ".", ".." and symbolic links resolved as far as it exists: one
// spelling for every way of naming a file, to key locks and claims on and to hand to processes
// started elsewhere. Where it cannot be resolved (a directory on the way that cannot be
// searched), absolute and lexically normal. No trailing slash but the root's.
std::string resolved_path(const std::string& path);

// Whether `path` is `dir` or lies under it, both resolved (resolved_path), component by
// component ("/a/bc" is not under "/a/b").
bool lies_in(const std::string& dir, const std::string& path);

// What an atomic replacement of `path` replaces: `path` itself, or the file a symbolic link
// there names. IoError when that is a directory, something other than a regular file (a
// device such as /dev/null, a FIFO, a socket), or a link to nothing.
std::string replacement_target(const std::string& path);

// Fails now where replacing `path` atomically would fail later, after the work that produced its
// content (a directory missing or not writable, a read-only filesystem, a directory or a device
// by that name): creates and removes the temporary file the replacement writes (temp_path).
// IoError "cannot write 'PATH': <reason>". Removes what writes of it killed before their commit
// left beside it first (remove_unfinished_writes).
void check_replaceable(const std::string& path);

// A write through an AtomicFile killed before its commit (SIGKILL, a crash, a power cut) leaves
// its temporary file, TARGET.tmp-PID-TID (or TARGET.tmp-PID, from older versions), as big as
// the file was to be, and nothing else removes it. Removes those in `dir` whose names begin with
// `name_prefix`, when no process PID runs here and nobody has written to the file for a minute:
// a directory on shared storage may hold a live writer's from another machine, whose PID means
// nothing here, and a write takes seconds. Each removal is said on stderr, after `who` ("tandem
// train", say). Never throws: a file it cannot list or remove is left.
void remove_unfinished_writes(const std::string& dir, const std::string& name_prefix,
                              const std::string& who) noexcept;

// Creates directory `dir` and its parents (nothing when it is there). IoError "cannot create
// WHAT 'DIR': <reason>" (WHAT: the option that named it, say) when it cannot, instead of the
// standard library's message, which names neither the option nor an empty path.
void create_output_directory(const std::string& dir, const std::string& what);

// fsyncs directory `dir`; returns 0, or the errno of the open or fsync that failed. A rename is
// durable only once its directory is: without this a crash can bring back the old entry.
int fsync_directory(const std::string& dir);

// fsyncs the directory holding `path`, just written or replaced by a rename; failing, throws
// IoError "cannot fsync directory 'DIR' after DOING 'PATH' (the new file may not survive a crash)".
void fsync_parent_directory(const std::string& path, const std::string& doing);

// A whole file mapped read-only (MAP_PRIVATE, pages populated up front), unmapped when destroyed.
// Reading a file from the page cache through a mapping skips the copy read() makes.
class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path`; an empty mapping (data() == nullptr) when the file does not exist, IoError for
  // any other failure.
  static MappedFile map_if_exists(const std::string& path);
  // Maps the first `size` bytes of the regular file open as `fd` (the descriptor may be closed
  // afterwards; `path` is for the error). IoError when the map fails.
  static MappedFile map_open(int fd, size_t size, const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }  // the file mapped, for messages
  // Whether the file mapped (the same file, wherever its name now points) is now shorter than
  // its mapping: its last pages are gone (reading them faults) and, past a cut inside a page,
  // bytes read as zeros without any fault.
  bool shrunk() const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  int fd_ = -1;  // the file, kept open for shrunk()'s fstat
};

// The temporary file beside `path` that this thread writes it through: PATH.tmp-PID-TID, so two
// threads or processes writing one path never share one.
std::string temp_path(const std::string& path);
// The file name a temp_path() name is the temporary file of (NAME for NAME.tmp-PID-TID, or
// NAME.tmp-PID from older versions); "" for a name that is not one.
std::string target_of_temp_name(const std::string& name);

// A file written through a temporary file (temp_path, beside the target) and a rename, so
// readers see the old file or the new one, never part of one. The target is
// replacement_target(path): a link's file is replaced, a device never. Construction creates the
// temporary file; commit() fsyncs it, closes it and renames it over the target; destroyed before
// commit() (a throw), it removes it. commit() leaves the directory unsynced: see
// fsync_parent_directory, of target().
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* buf, size_t n) { write_all(fd_.get(), buf, n, tmp_); }
  void commit();
  const std::string& target() const { return path_; }

 private:
  std::string path_;
  std::string tmp_;
  Fd fd_;
  TempFileGuard guard_;  // after fd_: it unlinks tmp only once fd_ holds it open
};

// Writes `text` as the whole of `path` through an AtomicFile and syncs the directory: a crash
// or a full disk leaves the old file or the new one, never an empty or a partial one.
void write_text_atomic(const std::string& path, const std::string& text);
// Removes the file write_text_atomic(path, text) wrote when it still holds exactly `text`, as the
// process that advertised itself through it ends: a file another process has written since is
// left, as is a missing or unreadable one, and a symbolic link (the user's: removing the file it
// names would leave it dangling, and the next write through it refused). (Checked, then
// removed: one written in between those two is removed too.) Never throws: it runs from
// destructors.
void remove_if_it_holds(const std::string& path, const std::string& text) noexcept;

}  // namespace tandem
