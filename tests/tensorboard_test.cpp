// CRC-32C against published vectors (RFC 3720 B.4) and TFRecord's mask; TensorBoard event files
// read back by a small independent reader (framing, both CRCs, the protobuf fields), including
// every single-byte corruption being caught. TensorBoard's own reader checks the same files in
// tests/python/tensorboard_read_test.py.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "crc32c.h"
#include "tandem/error.h"
#include "tensorboard_writer.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc_of(""), 0u);
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string up(32, 0), down(32, 0);
  for (int i = 0; i < 32; ++i) up[i] = char(i), down[i] = char(31 - i);
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
  const std::string nine = "123456789";
  EXPECT_EQ(crc32c_extend_portable(0, nine.data(), nine.size()), 0xE3069283u);
}

TEST(Crc32c, MaskedForm) {
  EXPECT_EQ(crc32c_mask(0), 0xa282ead8u);
  EXPECT_EQ(crc32c_mask(0xE3069283u), 0xC78AB0E5u);  // TensorBoard's masked_crc32c(b"123456789")
  EXPECT_EQ(crc32c_mask(0x8A9136AAu), 0x0FD7FFFAu);
  for (uint32_t c : {0u, 1u, 0x80000000u, 0xFFFFFFFFu, 0xE3069283u, 0x12345678u})
    EXPECT_EQ(crc32c_unmask(crc32c_mask(c)), c) << std::hex << c;
}

// The dispatched version (SSE4.2 where present) equals the table version at every length and
// alignment, and extending equals hashing the concatenation.
TEST(Crc32c, FastPathMatchesTableAndExtends) {
  std::mt19937 gen(7);
  std::vector<uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(gen());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63},
                     size_t{1000}, size_t{4093}}) {
      const uint8_t* p = buf.data() + offset;
      const uint32_t want = crc32c_extend_portable(0, p, n);
      ASSERT_EQ(crc32c(p, n), want) << "offset " << offset << " length " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        ASSERT_EQ(crc32c_extend(crc32c(p, cut), p + cut, n - cut), want) << n << " cut " << cut;
        ASSERT_EQ(crc32c_extend_portable(crc32c_extend_portable(0, p, cut), p + cut, n - cut), want);
      }
    }
  }
  std::printf("crc32c hardware accelerated: %s\n", crc32c_hardware_accelerated() ? "yes" : "no");
}

// Byte-exact Events, worked out by hand from the wire format.
TEST(TensorBoardEncoding, GoldenBytes) {
  // step 1 (10 01), summary (2A 0A) { value (0A 08) { tag "a" (0A 01 61), simple_value 1.0f
  // (15 00 00 80 3F) } }; wall_time 0.0 is proto3's default and left out.
  EXPECT_EQ(encode_scalar_event("a", 1, 1.0f, 0.0),
            std::string("\x10\x01\x2A\x0A\x0A\x08\x0A\x01"
                        "a\x15\x00\x00\x80\x3F",
                        14));
  // wall_time 2.5 (09 + 8 bytes LE), step 0 left out, simple_value 0.0 kept (a oneof member).
  EXPECT_EQ(encode_scalar_event("b", 0, 0.0f, 2.5),
            std::string("\x09\x00\x00\x00\x00\x00\x00\x04\x40\x2A\x0A\x0A\x08\x0A\x01"
                        "b\x15\x00\x00\x00\x00",
                        21));
  // step -1: ten-byte varint.
  EXPECT_EQ(encode_scalar_event("c", -1, 1.0f, 0.0).substr(0, 11),
            std::string("\x10\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x01", 11));
  EXPECT_EQ(encode_file_version_event(0.0, "brain.Event:2"), std::string("\x1A\x0D") + "brain.Event:2");
  // Framing: length 3 LE, masked CRC of the 8 length bytes, data, masked CRC of the data.
  const std::string framed = tfrecord_frame("abc");
  ASSERT_EQ(framed.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(framed.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  uint32_t len_crc, data_crc;
  std::memcpy(&len_crc, framed.data() + 8, 4);
  std::memcpy(&data_crc, framed.data() + 15, 4);
  EXPECT_EQ(len_crc, crc32c_mask(crc32c(framed.data(), 8)));
  EXPECT_EQ(framed.substr(12, 3), "abc");
  EXPECT_EQ(data_crc, crc32c_mask(crc_of("abc")));
}

// ---- A small reader, independent of the writer's encoder ----

struct ParsedEvent {
  std::optional<double> wall_time;
  int64_t step = 0;
  std::optional<std::string> file_version;
  std::vector<std::pair<std::string, float>> values;
};

struct Cursor {
  const std::string& s;
  size_t pos, end;
  bool ok = true;
  bool done() const { return pos >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos >= end) break;
      const auto b = static_cast<uint8_t>(s[pos++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
  uint64_t fixed(int bytes) {
    if (end - pos < size_t(bytes)) {
      ok = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(s[pos + i])) << (8 * i);
    pos += bytes;
    return v;
  }
  std::string bytes() {
    const uint64_t n = varint();
    if (!ok || n > end - pos) {
      ok = false;
      return {};
    }
    std::string out = s.substr(pos, n);
    pos += n;
    return out;
  }
};

// Parses one serialized Event; an error message on anything unexpected.
std::string parse_event(const std::string& data, ParsedEvent& ev) {
  Cursor c{data, 0, data.size()};
  while (!c.done() && c.ok) {
    const uint64_t key = c.varint();
    if (key == ((1 << 3) | 1)) {
      const uint64_t bits = c.fixed(8);
      double w;
      std::memcpy(&w, &bits, 8);
      ev.wall_time = w;
    } else if (key == ((2 << 3) | 0)) {
      ev.step = static_cast<int64_t>(c.varint());
    } else if (key == ((3 << 3) | 2)) {
      ev.file_version = c.bytes();
    } else if (key == ((5 << 3) | 2)) {
      const std::string summary = c.bytes();
      Cursor cs{summary, 0, summary.size()};
      while (!cs.done() && cs.ok) {
        if (cs.varint() != ((1 << 3) | 2)) return "unexpected field in Summary";
        const std::string value = cs.bytes();
        Cursor cv{value, 0, value.size()};
        std::string tag;
        std::optional<float> simple;
        while (!cv.done() && cv.ok) {
          const uint64_t k = cv.varint();
          if (k == ((1 << 3) | 2)) {
            tag = cv.bytes();
          } else if (k == ((2 << 3) | 5)) {
            const auto bits = static_cast<uint32_t>(cv.fixed(4));
            float f;
            std::memcpy(&f, &bits, 4);
            simple = f;
          } else {
            return "unexpected field in Summary.Value";
          }
        }
        if (!cv.ok || !simple) return "bad Summary.Value";
        ev.values.emplace_back(tag, *simple);
      }
      if (!cs.ok) return "bad Summary";
    } else {
      return "unexpected field in Event (key " + std::to_string(key) + ")";
    }
  }
  return c.ok ? "" : "truncated Event";
}

// Reads every record of a TFRecord file; the error names the record and what failed.
std::string read_events(const std::string& bytes, std::vector<ParsedEvent>& events) {
  size_t pos = 0;
  for (int record = 0; pos < bytes.size(); ++record) {
    const std::string where = "record " + std::to_string(record) + ": ";
    if (bytes.size() - pos < 12) return where + "truncated header";
    uint64_t len = 0;
    for (int i = 0; i < 8; ++i) len |= uint64_t(static_cast<uint8_t>(bytes[pos + i])) << (8 * i);
    uint32_t len_crc;
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    if (crc32c_unmask(len_crc) != crc32c(bytes.data() + pos, 8)) return where + "length CRC";
    if (bytes.size() - pos - 12 < len + 4) return where + "truncated data";
    const std::string data = bytes.substr(pos + 12, len);
    uint32_t data_crc;
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    if (crc32c_unmask(data_crc) != crc_of(data)) return where + "data CRC";
    ParsedEvent ev;
    const std::string err = parse_event(data, ev);
    if (!err.empty()) return where + err;
    events.push_back(std::move(ev));
    pos += 12 + len + 4;
  }
  return "";
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

struct Scalar {
  std::string tag;
  int64_t step;
  float value;
  double wall_time;
};

std::vector<Scalar> known_scalars() {
  return {{"validation/accuracy", 0, 0.0f, 1700000000.25},
          {"validation/loss", 1, 2274.125f, 1700000001.5},
          {"train/samples_per_s", 1, 438300.0f, 1700000001.75},
          {"validation/accuracy", 2, 0.8378f, 1700000002.0},
          {"t\xC3\xA4g/\xE2\x82\xAC", 3, -1.5e-42f, 1700000003.0},  // UTF-8 tag, subnormal
          {std::string(200, 'x'), 4, 3.4028235e38f, 1700000004.0},     // two-byte length
          {"validation/accuracy", int64_t{1} << 40, -0.0f, 1700000005.0}};
}

TEST(TensorBoardWriter, FileReadsBackExactly) {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "runs" / "a";  // parents created
  const double before = wall_clock_seconds();
  std::string path;
  {
    TensorBoardWriter writer(dir.string());
    path = writer.path();
    for (const auto& s : known_scalars()) writer.add_scalar(s.tag, s.step, s.value, s.wall_time);
    writer.add_scalar("now", 7, 1.0f);
    writer.flush(true);
  }
  const double after = wall_clock_seconds();
  const auto files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].string(), path);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string name = files[0].filename().string();
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const int64_t secs = std::stoll(name.substr(prefix.size()));
  EXPECT_GE(secs, static_cast<int64_t>(before));
  EXPECT_LE(secs, static_cast<int64_t>(after));
  EXPECT_EQ(name.substr(name.find('.', prefix.size()) + 1),
            std::string(host) + "." + std::to_string(getpid()));

  std::vector<ParsedEvent> events;
  ASSERT_EQ(read_events(test::read_bytes(path), events), "");
  const auto want = known_scalars();
  ASSERT_EQ(events.size(), want.size() + 2);
  ASSERT_TRUE(events[0].file_version.has_value());
  EXPECT_EQ(*events[0].file_version, "brain.Event:2");
  ASSERT_TRUE(events[0].wall_time.has_value());
  EXPECT_GE(*events[0].wall_time, before);
  EXPECT_LE(*events[0].wall_time, after);
  EXPECT_TRUE(events[0].values.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    const ParsedEvent& ev = events[i + 1];
    SCOPED_TRACE("scalar " + std::to_string(i));
    EXPECT_FALSE(ev.file_version.has_value());
    EXPECT_EQ(ev.wall_time.value_or(0.0), want[i].wall_time);
    EXPECT_EQ(ev.step, want[i].step);
    ASSERT_EQ(ev.values.size(), 1u);
    EXPECT_EQ(ev.values[0].first, want[i].tag);
    uint32_t got_bits, want_bits;
    std::memcpy(&got_bits, &ev.values[0].second, 4);
    std::memcpy(&want_bits, &want[i].value, 4);
    EXPECT_EQ(got_bits, want_bits);  // bit-exact, so -0.0 and subnormals count
  }
  const ParsedEvent& last = events.back();
  EXPECT_EQ(last.step, 7);
  EXPECT_GE(last.wall_time.value_or(0.0), before);
  EXPECT_LE(last.wall_time.value_or(0.0), after);
}

// Every single-byte change anywhere in the file is caught by one of the two CRCs (CRC-32C finds
// every burst error up to 32 bits long).
TEST(TensorBoardWriter, EveryCorruptedByteIsDetected) {
  test::TempDir tmp;
  std::string path;
  {
    TensorBoardWriter writer(tmp.path().string());
    path = writer.path();
    writer.add_scalar("loss", 1, 0.5f, 100.0);
    writer.add_scalar("accuracy", 1, 0.875f, 100.0);
  }
  const std::string good = test::read_bytes(path);
  std::vector<ParsedEvent> events;
  ASSERT_EQ(read_events(good, events), "");
  ASSERT_EQ(events.size(), 3u);
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      std::vector<ParsedEvent> ignored;
      const std::string err = read_events(bad, ignored);
      EXPECT_TRUE(err.find("CRC") != std::string::npos || err.find("truncated") != std::string::npos)
          << "byte " << i << " xor " << int(flip) << " gave '" << err << "'";
    }
  }
}

// Several threads log at once: every record is whole, and each thread's own order is kept.
TEST(TensorBoardWriter, ThreadsInterleaveWholeRecords) {
  test::TempDir tmp;
  constexpr int kThreads = 4, kPerThread = 500;
  std::string path;
  {
    TensorBoardWriter writer(tmp.path().string());
    path = writer.path();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&writer, t] {
        const std::string tag = "role" + std::to_string(t) + "/loss";
        for (int i = 0; i < kPerThread; ++i)
          writer.add_scalar(tag, i, static_cast<float>(t * 1000 + i), 1e9 + i);
      });
    for (auto& th : threads) th.join();
  }
  std::vector<ParsedEvent> events;
  ASSERT_EQ(read_events(test::read_bytes(path), events), "");
  ASSERT_EQ(events.size(), size_t{kThreads * kPerThread + 1});
  std::vector<int> next(kThreads, 0);
  for (size_t e = 1; e < events.size(); ++e) {
    ASSERT_EQ(events[e].values.size(), 1u);
    const std::string& tag = events[e].values[0].first;
    const int t = tag[4] - '0';
    ASSERT_TRUE(t >= 0 && t < kThreads) << tag;
    EXPECT_EQ(events[e].step, next[t]);
    EXPECT_EQ(events[e].values[0].second, static_cast<float>(t * 1000 + next[t]));
    ++next[t];
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next[t], kPerThread);
}

TEST(TensorBoardWriter, TwoWritersInOneSecondGetTwoFiles) {
  test::TempDir tmp;
  TensorBoardWriter a(tmp.path().string()), b(tmp.path().string()), c(tmp.path().string());
  EXPECT_NE(a.path(), b.path());
  EXPECT_NE(b.path(), c.path());
  EXPECT_NE(a.path(), c.path());
  EXPECT_EQ(event_files(tmp.path()).size(), 3u);
}

TEST(TensorBoardWriter, ErrorsNameThePath) {
  test::TempDir tmp;
  const std::string file = tmp.file("plain_file");
  test::write_bytes(file, std::string("x"));
  try {
    TensorBoardWriter writer(file + "/logs");
    FAIL() << "a directory under a plain file was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/logs"), std::string::npos) << e.what();
  }

  TensorBoardWriter writer(tmp.path().string());
  EXPECT_THROW(writer.add_scalar("", 1, 1.0f), InputError);
  EXPECT_THROW(writer.add_scalar("bad\xFFutf8", 1, 1.0f), InputError);
  EXPECT_THROW(writer.add_scalar("cut\xE2\x82", 1, 1.0f), InputError);
  EXPECT_THROW(writer.add_scalar("surrogate\xED\xA0\x80", 1, 1.0f), InputError);
  EXPECT_THROW(writer.add_scalar("overlong\xC0\xAF", 1, 1.0f), InputError);
  writer.add_scalar("ok", 1, 1.0f);
  writer.close();
  writer.close();  // idempotent
  try {
    writer.add_scalar("late", 2, 1.0f);
    FAIL() << "add_scalar after close was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(writer.path()), std::string::npos) << e.what();
  }
  std::vector<ParsedEvent> events;
  ASSERT_EQ(read_events(test::read_bytes(writer.path()), events), "");
  EXPECT_EQ(events.size(), 2u);  // the file version and "ok": the refused tags wrote nothing
}

// A write that fails part way (a full disk; here the file size limit) cut a record short in the
// file, and the writer went on: the records written after it, once there was room again, were
// swallowed by the cut record's length, and TensorBoard stopped reading at it for good. Now the
// file is cut back to its last whole record and the writer takes no more. In a child process:
// the size limit and its signal are the whole process's.
TEST(TensorBoardWriter, AFailedWriteLeavesWholeRecordsAndTakesNoMore) {
  test::TempDir tmp;
  const std::string dir = tmp.path().string();
  int last_step = -1;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
    TensorBoardWriter writer(dir);
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    const rlimit before = limit;
    limit.rlim_cur = 10000;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(20);
    int step = 0;
    try {
      for (; step < 100; ++step) {
        writer.add_scalar(std::string(900, 'x'), step, 1.0f);
        writer.flush();
      }
      _exit(10);  // the limit never bit
    } catch (const IoError&) {
    }
    const int written = step - 1;
    if (::write(pipe_fds[1], &written, sizeof written) != sizeof written) _exit(21);
    if (::setrlimit(RLIMIT_FSIZE, &before) != 0) _exit(22);  // room again
    try {
      writer.add_scalar("after", 1000, 2.0f);
      writer.flush();
      _exit(11);  // taken after the failure
    } catch (const IoError& e) {
      if (std::string(e.what()).find("takes no more") == std::string::npos) _exit(12);
    }
    writer.close();  // (nothing left to finish: no throw)
    _exit(0);
  }
  ::close(pipe_fds[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  ASSERT_EQ(WEXITSTATUS(status), 0) << "10: never failed; 11: took a record after failing; "
                                       "12: another message; 2x: setup";
  ASSERT_EQ(::read(pipe_fds[0], &last_step, sizeof last_step), ssize_t(sizeof last_step));
  ::close(pipe_fds[0]);
  ASSERT_GE(last_step, 1) << "the limit bit before two records were written";
  const std::vector<fs::path> files = event_files(tmp.path());
  ASSERT_EQ(files.size(), 1u);
  std::vector<ParsedEvent> events;
  EXPECT_EQ(read_events(test::read_bytes(files[0].string()), events), "")
      << "the file ends in a record cut short";
  ASSERT_EQ(events.size(), static_cast<size_t>(last_step) + 2);  // the file version, 0..last
  EXPECT_EQ(events.back().step, last_step);
}

}  // namespace
}  // namespace tandem
