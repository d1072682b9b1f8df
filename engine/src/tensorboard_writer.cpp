#include "tensorboard_writer.h"

#include <fcntl.h>
#include <stdio_ext.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "crc32c.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (uint64_t{field} << 3) | wire_type);
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields 1 and 2. proto3 leaves out a field holding its default (0.0 / 0), as does
// protobuf's own serializer; a wall_time of -0.0 is not the default and is kept.
void put_event_header(std::string& out, double wall_time, int64_t step) {
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof bits);
  if (bits != 0) {
    put_key(out, 1, kFixed64);
    put_le(out, bits, 8);
  }
  if (step != 0) {
    put_key(out, 2, kVarint);
    put_varint(out, static_cast<uint64_t>(step));  // negative int64: ten bytes, two's complement
  }
}

// protobuf rejects a proto3 string that is not UTF-8, and TensorBoard would stop reading the
// file at that event: refuse such a tag up front.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t extra;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // cut short
    for (size_t k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

double wall_clock_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, crc32c_mask(crc32c(out.data(), 8)), 4);
  out.append(data);
  put_le(out, crc32c_mask(crc32c(data.data(), data.size())), 4);
  return out;
}

std::string encode_file_version_event(double wall_time, std::string_view file_version) {
  std::string event;
  put_event_header(event, wall_time, 0);
  put_bytes_field(event, 3, file_version);
  return event;
}

std::string encode_scalar_event(std::string_view tag, int64_t step, float value,
                                double wall_time) {
  std::string summary_value;
  put_bytes_field(summary_value, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(summary_value, 2, kFixed32);  // in a oneof: written even when 0.0
  put_le(summary_value, bits, 4);
  std::string summary;
  put_bytes_field(summary, 1, summary_value);
  std::string event;
  put_event_header(event, wall_time, step);
  put_bytes_field(event, 5, summary);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError("cannot create TensorBoard log directory '" + dir + "': " + ec.message());
  const double now = wall_clock_seconds();
  const std::string base = (std::filesystem::path(dir) /
                            ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) +
                             "." + host_name() + "." + std::to_string(getpid())))
                               .string();
  // O_EXCL: two writers of one process opened in the same second must not share a file.
  int fd = -1;
  for (int n = 0; fd < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || n == 1000))
      throw IoError("cannot create TensorBoard event file '" + path_ + "': " +
                    std::strerror(errno));
  }
  // A file this constructor made and could not start is removed: left empty, it would make the
  // next run's writer in this directory refuse it as another run's events.
  file_ = fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    ::unlink(path_.c_str());
    throw IoError("cannot open TensorBoard event file '" + path_ + "': " + std::strerror(err));
  }
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    write_record(encode_file_version_event(now, "brain.Event:2"));
  } catch (...) {
    if (file_ != nullptr) std::fclose(file_);  // no destructor runs for a constructor that throws
    file_ = nullptr;
    // Once: a second unlink could remove another writer's file, made under the freed name.
    if (!removed_) ::unlink(path_.c_str());
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: %s\n", e.what());
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, float value,
                                   double wall_time) {
  if (tag.empty() || !valid_utf8(tag))
    throw InputError("TensorBoard scalar tag '" + tag + "' for " + path_ +
                     (tag.empty() ? " is empty" : " is not valid UTF-8"));
  const std::string event = encode_scalar_event(tag, step, value, wall_time);
  std::lock_guard<std::mutex> lock(mutex_);
  write_record(event);
}

void TensorBoardWriter::check_open() const {
  if (!failed_.empty()) throw IoError(failed_);
  if (file_ == nullptr) throw IoError("TensorBoard event file '" + path_ + "' is closed");
}

void TensorBoardWriter::write_record(const std::string& event) {
  check_open();
  const std::string record = tfrecord_frame(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    fail("cannot write TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  record_ends_.push_back(record_ends_.empty() ? record.size() : record_ends_.back() + record.size());
}

void TensorBoardWriter::fail(const std::string& what) {
  // A failed write (a full disk) may have put part of the buffer down: a record cut short there
  // would swallow every record written after it, and TensorBoard stops reading at it for good.
  // The file is cut back to the last whole record that reached it, and the writer takes no more
  // (a later write, with room again, would land after the cut record, unread).
  std::FILE* f = file_;
  file_ = nullptr;
  failed_ = what + "; the event file keeps the records before the failure, and takes no more";
  struct stat st {};
  if (::fstat(fileno(f), &st) == 0) {
    uint64_t keep = 0;
    for (uint64_t end : record_ends_)
      if (end <= static_cast<uint64_t>(st.st_size)) keep = end;
    // With no whole record (not even the file's first), the file goes: left empty, it would
    // make the next run's writer in this directory refuse it as another run's events.
    if (keep == 0) {
      ::unlink(path_.c_str());
      removed_ = true;
    } else if (::ftruncate(fileno(f), static_cast<off_t>(keep)) != 0) {
      // (the cut record stays; nothing more is written after it)
    }
  }
  __fpurge(f);  // the buffer's unwritten bytes, which fclose would write after the cut
  std::fclose(f);
  throw IoError(failed_);
}

void TensorBoardWriter::flush(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open();
  if (std::fflush(file_) != 0)
    fail("cannot write TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  if (sync && ::fsync(fileno(file_)) != 0)
    fail("cannot fsync TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  // Everything written is in the file now: only the last end is needed to cut back to.
  if (record_ends_.size() > 1) record_ends_.erase(record_ends_.begin(), record_ends_.end() - 1);
}

void TensorBoardWriter::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;  // closed, or failed (said then)
  if (std::fflush(file_) != 0)
    fail("cannot write TensorBoard event file '" + path_ + "': " + std::strerror(errno));
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0)
    throw IoError("cannot write TensorBoard event file '" + path_ + "': " + std::strerror(errno));
}

}  // namespace tandem
