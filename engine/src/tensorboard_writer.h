// TensorBoard event files written natively: no TensorFlow, no protobuf library. A file is a
// TFRecord stream (each record: uint64 length, masked CRC-32C of those 8 bytes, the data, masked
// CRC-32C of the data; all little-endian) of serialized tensorboard.Event messages, of which the
// few fields used here are encoded by hand (tensorflow/core/util/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2;
//             oneof what { string file_version = 3; Summary summary = 5; } }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; oneof value { float simple_value = 2; } }
// Encoded as protobuf itself does (fields in number order, proto3 defaults left out), so a
// reparse-and-reserialize by protobuf gives the same bytes back (tests/python checks that).
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Seconds since the Unix epoch, as TensorBoard's wall_time.
double wall_clock_seconds();

// One TFRecord: the framing around `data`.
std::string tfrecord_frame(std::string_view data);
// The serialized Event that starts every event file: wall_time and file_version.
std::string encode_file_version_event(double wall_time, std::string_view file_version);
// The serialized Event holding one scalar summary value.
std::string encode_scalar_event(std::string_view tag, int64_t step, float value, double wall_time);

// Writes one event file in `dir` (created, with its parents, when missing):
//   DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>
// (with ".N" appended when a writer in the same process already took that name this second),
// starting with an Event{wall_time, file_version: "brain.Event:2"}. Scalars are buffered; flush()
// hands them to the OS (TensorBoard then sees them), close() or the destructor finishes the file.
// All members may be called from several threads at once. Failures throw IoError naming the file
// (InputError for a bad tag); the destructor reports a failure on stderr instead. After a failed
// write (a full disk) the file is cut back to its last whole record, still readable to the end,
// and every later call throws.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event with a scalar summary value: `tag` (non-empty UTF-8, e.g. "validation/accuracy")
  // at `step`. Steps should not go down: TensorBoard's own view drops earlier points with a
  // step at or after a step that goes back (it takes that for a restart from a checkpoint), but
  // the file keeps them, and other readers (EventAccumulator, tbparse) show both.
  void add_scalar(const std::string& tag, int64_t step, float value,
                  double wall_time = wall_clock_seconds());
  // fflush; with sync, also fsync, so the records survive a machine crash.
  void flush(bool sync = false);
  // Flushes and closes the file; later calls to add_scalar or flush throw. Idempotent.
  void close();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);  // frames and writes, under mutex_
  void check_open() const;                      // IoError once closed or failed
  // After a failed write: cuts the file back to its last whole record, closes it and throws
  // IoError(what); every later call throws it again.
  [[noreturn]] void fail(const std::string& what);

  std::string path_;
  std::mutex mutex_;
  std::FILE* file_ = nullptr;
  std::vector<uint64_t> record_ends_;  // the file offset after each record written
  std::string failed_;                 // why the file takes no more records
  bool removed_ = false;               // fail() removed the file (it held no whole record)
};

}  // namespace tandem
