// Chunk compression for Zarr stores: none, zstd (libzstd), blosc (c-blosc 1.x), and gzip and zlib
// (deflate, from zlib). Decompression
// treats every stored byte as hostile: the sizes a header declares are checked against the size
// the array's metadata says a chunk has before anything is decompressed, and the output buffer is
// never larger than that size.
#include <blosc.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

#include "crc32c.h"
#include "tandem/error.h"
#include "zarr/zarr_array.h"
#include "zarr/zarr_metadata.h"

namespace tandem::zarr {
namespace {

constexpr int kDefaultZstdLevel = 3;   // zstd's own default
constexpr int kDefaultBloscLevel = 5;  // numcodecs' and zarr-python's default clevel
constexpr int kDefaultGzipLevel = 5;   // zarr-python 3's GzipCodec default
constexpr int kDefaultZlibLevel = 1;   // numcodecs' Zlib default
// Room beyond zlib's compressBound for what other gzip writers add: a header with a file name or
// comment, or several members (Python's gzip reads them all, so this reader does too).
constexpr size_t kDeflateWrapperSlack = size_t{64} << 10;
// A plain gzip header and trailer (10 + 8 bytes), with room to spare.
constexpr size_t kDeflatePartHeader = 64;

[[noreturn]] void corrupt(const std::string& what, const std::string& problem) {
  throw InputError(what + ": " + problem);
}

// A strict integer: optional '-', digits, nothing else (std::stoi would accept "5x").
bool parse_int(const std::string& text, int& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end && !text.empty();
}

const char* shuffle_suffix(int shuffle) {
  switch (shuffle) {
    case BLOSC_NOSHUFFLE: return "-noshuffle";
    case BLOSC_BITSHUFFLE: return "-bitshuffle";
    default: return "";  // byte shuffle is the default and needs no suffix
  }
}

// "lz4", "lz4-noshuffle", "zstd-bitshuffle", ... into cname and shuffle.
bool parse_blosc_name(const std::string& text, Compressor& c) {
  const size_t dash = text.find('-');
  c.blosc_cname = text.substr(0, dash);
  c.blosc_shuffle = BLOSC_SHUFFLE;
  if (dash == std::string::npos) return !c.blosc_cname.empty();
  const std::string shuffle = text.substr(dash + 1);
  if (shuffle == "shuffle") return true;
  if (shuffle == "noshuffle") c.blosc_shuffle = BLOSC_NOSHUFFLE;
  else if (shuffle == "bitshuffle") c.blosc_shuffle = BLOSC_BITSHUFFLE;
  else return false;
  return true;
}

// The blosc compressors this build of libblosc has. Not blosc_list_compressors(): it fills a
// static buffer on first use, a data race when chunks are checked on several threads.
std::string available_blosc_compressors() {
  std::string list;
  for (const char* name : {"blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd"}) {
    if (blosc_compname_to_compcode(name) >= 0) list += (list.empty() ? "" : ", ") + std::string(name);
  }
  return list;
}

// One decompression context per thread: creating one per chunk costs more than small chunks'
// decompression, and a context must not be shared between threads.
ZSTD_DCtx* thread_dctx() {
  struct Free {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
  };
  thread_local std::unique_ptr<ZSTD_DCtx, Free> dctx(ZSTD_createDCtx());
  if (!dctx) throw Error("zstd: cannot create a decompression context (out of memory)");
  return dctx.get();
}

std::vector<uint8_t> compress_zstd(const Compressor& c, const uint8_t* data, size_t size) {
  std::vector<uint8_t> out(ZSTD_compressBound(size));
  const size_t n = ZSTD_compress(out.data(), out.size(), data, size, c.level);
  if (ZSTD_isError(n)) throw Error(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

std::vector<uint8_t> compress_blosc(const Compressor& c, const uint8_t* data, size_t size,
                                    size_t type_size) {
  if (size > BLOSC_MAX_BUFFERSIZE) {
    throw InputError("blosc compression: " + std::to_string(size) + " bytes is more than blosc's " +
                     std::to_string(BLOSC_MAX_BUFFERSIZE) + "-byte limit; expected smaller chunks");
  }
  if (type_size == 0 || type_size > BLOSC_MAX_TYPESIZE) {
    throw Error("blosc compression: type size " + std::to_string(type_size) +
                " is out of range; expected 1 to " + std::to_string(BLOSC_MAX_TYPESIZE));
  }
  // With room for the header blosc always succeeds: it stores incompressible data verbatim.
  std::vector<uint8_t> out(size + BLOSC_MAX_OVERHEAD);
  // The _ctx form keeps no global state, so chunks can be compressed on several threads; one
  // internal thread because the callers parallelise over chunks.
  const int n = blosc_compress_ctx(c.level, c.blosc_shuffle, type_size, size, data, out.data(),
                                   out.size(), c.blosc_cname.c_str(), size_t(c.blosc_blocksize), 1);
  if (n <= 0) {
    throw Error("blosc compression with '" + c.blosc_cname + "' failed (code " +
                std::to_string(n) + ")");
  }
  out.resize(size_t(n));
  return out;
}

void decompress_zstd(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size,
                     const std::string& what) {
  const std::string expected = "; expected " + std::to_string(out_size) + " bytes (the chunk size)";
  // Frames written by zstd's one-shot API (numcodecs, zarr-python) declare their size: the sizes
  // the frames declare are summed and a wrong sum refused before decompressing. Skippable frames
  // declare none (pzstd starts every file with one); streamed frames may not declare theirs, and
  // the bounded output buffer and the final size check below cover those.
  unsigned long long declared = 0;
  bool all_declared = true;
  size_t frames = 0, at = 0;
  do {
    const size_t frame = ZSTD_findFrameCompressedSize(in + at, in_size - at);
    if (ZSTD_isError(frame)) {
      if (at == 0)
        corrupt(what, "not a zstd frame (bad magic number or truncated frame header); expected "
                      "zstd data of " + std::to_string(out_size) + " bytes");
      corrupt(what, "zstd data is corrupt or truncated in its frame at byte " +
                        std::to_string(at) + " (" + ZSTD_getErrorName(frame) + ")" + expected);
    }
    const unsigned long long size = ZSTD_getFrameContentSize(in + at, frame);
    if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR)
      all_declared = false;
    else
      declared = size > ~0ull - declared ? ~0ull : declared + size;
    at += frame;
    ++frames;
  } while (at < in_size);
  if (all_declared && declared != out_size) {
    corrupt(what, (frames == 1 ? "zstd frame declares " : "zstd frames declare ") +
                      std::to_string(declared) + " bytes" + expected);
  }
  // Decompresses straight into `out`: one-shot decompression allocates no window, so no frame
  // header can make it allocate; content checksums, when present, are verified here.
  const size_t got = ZSTD_decompressDCtx(thread_dctx(), out, out_size, in, in_size);
  if (ZSTD_isError(got)) {
    corrupt(what, std::string("zstd data is corrupt or too large (") + ZSTD_getErrorName(got) +
                      ")" + expected);
  }
  if (got != out_size) {
    corrupt(what, "zstd data decompresses to " + std::to_string(got) + " bytes" + expected);
  }
}

void decompress_blosc(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size,
                      const std::string& what) {
  const std::string expected = "; expected " + std::to_string(out_size) + " bytes (the chunk size)";
  if (in_size < BLOSC_MIN_HEADER_LENGTH) {
    corrupt(what, "blosc data is " + std::to_string(in_size) + " bytes, shorter than the " +
                      std::to_string(BLOSC_MIN_HEADER_LENGTH) + "-byte blosc header; expected a "
                      "blosc buffer of " + std::to_string(out_size) + " bytes");
  }
  // The header's sizes first (it reads only the 16 header bytes, present as checked above): the
  // compressed size must be the whole chunk file and the decompressed size the chunk's size.
  size_t nbytes = 0, cbytes = 0, blocksize = 0;
  blosc_cbuffer_sizes(in, &nbytes, &cbytes, &blocksize);
  if (cbytes != in_size) {
    corrupt(what, "blosc header gives " + std::to_string(cbytes) +
                      " compressed bytes but the data is " + std::to_string(in_size) +
                      " bytes (corrupt, truncated or an unsupported blosc format version); "
                      "expected the two to agree");
  }
  if (nbytes != out_size) {
    corrupt(what, "blosc header gives " + std::to_string(nbytes) + " decompressed bytes" + expected);
  }
  // blosc's own check that the block offsets inside the buffer are consistent: the library
  // promises decompression is safe to attempt only after it passes.
  size_t validated = 0;
  if (blosc_cbuffer_validate(in, in_size, &validated) != 0 || validated != out_size) {
    corrupt(what, "blosc header is inconsistent (blosc_cbuffer_validate failed)" + expected);
  }
  const int got = blosc_decompress_ctx(in, out, out_size, 1);
  if (got < 0 || size_t(got) != out_size) {
    corrupt(what, "blosc data is corrupt (decompression returned " + std::to_string(got) + ")" +
                      expected);
  }
}

// windowBits for zlib's deflate/inflate: 16 + 15 is a gzip wrapper, 15 a zlib one.
int deflate_window_bits(Compressor::Kind kind) {
  return kind == Compressor::Kind::Gzip ? 16 + MAX_WBITS : MAX_WBITS;
}

const char* deflate_name(Compressor::Kind kind) {
  return kind == Compressor::Kind::Gzip ? "gzip" : "zlib";
}

std::vector<uint8_t> compress_deflate(const Compressor& c, const uint8_t* data, size_t size) {
  if (size > UINT_MAX) throw InputError(std::string(deflate_name(c.kind)) + " compression: " +
                                        std::to_string(size) + " bytes is more than one call "
                                        "takes; expected smaller chunks");
  z_stream s{};
  if (deflateInit2(&s, c.level, Z_DEFLATED, deflate_window_bits(c.kind), 8, Z_DEFAULT_STRATEGY) !=
      Z_OK)
    throw Error(std::string(deflate_name(c.kind)) + ": cannot start compression (out of memory)");
  // zlib's gzip header: no name, time 0, so equal chunks compress to equal files.
  std::vector<uint8_t> out(deflateBound(&s, uLong(size)));
  s.next_in = const_cast<Bytef*>(data);
  s.avail_in = uInt(size);
  s.next_out = out.data();
  s.avail_out = uInt(out.size());
  const int rc = deflate(&s, Z_FINISH);  // deflateBound's room: one call finishes
  const size_t n = size_t(s.total_out);
  deflateEnd(&s);
  if (rc != Z_STREAM_END)
    throw Error(std::string(deflate_name(c.kind)) + " compression failed (code " +
                std::to_string(rc) + ")");
  out.resize(n);
  return out;
}

// One inflate stream per thread, reset for each chunk to the wrapper it needs, as the zstd
// context above: a fresh one allocates its state and 32 KiB window per chunk (a shard's inner
// chunks may be many and small).
z_stream& thread_inflater(Compressor::Kind kind) {
  struct Inflater {
    z_stream s{};
    bool ready = false;
    ~Inflater() {
      if (ready) inflateEnd(&s);
    }
  };
  thread_local Inflater inflater;
  const int rc = inflater.ready ? inflateReset2(&inflater.s, deflate_window_bits(kind))
                                : inflateInit2(&inflater.s, deflate_window_bits(kind));
  if (rc != Z_OK)
    throw Error(std::string(deflate_name(kind)) + ": cannot start decompression (out of memory)");
  inflater.ready = true;
  return inflater.s;
}

// Inflates into exactly out_size bytes. A gzip stream may hold several members, one after the
// other, with zero bytes between and after them, as Python's gzip module (numcodecs' GZip)
// reads it.
void decompress_deflate(Compressor::Kind kind, const uint8_t* in, size_t in_size, uint8_t* out,
                        size_t out_size, const std::string& what) {
  const std::string name = deflate_name(kind);
  const std::string expected = "; expected " + std::to_string(out_size) + " bytes (the chunk size)";
  if (in_size > UINT_MAX || out_size > UINT_MAX)
    corrupt(what, name + " data of " + std::to_string(in_size) + " bytes is too large" + expected);
  z_stream& s = thread_inflater(kind);
  s.next_in = const_cast<Bytef*>(in);
  s.avail_in = uInt(in_size);
  s.next_out = out;
  s.avail_out = uInt(out_size);
  const auto problem = [&](const std::string& text) {
    corrupt(what, name + " data " + text + expected);
  };
  for (;;) {
    const int rc = inflate(&s, Z_NO_FLUSH);
    if (rc == Z_OK) continue;  // progress; the next call goes on
    if (rc == Z_STREAM_END) {
      if (kind != Compressor::Kind::Gzip) {
        // Stricter than Python's zlib module, which ignores them: no writer leaves any, so
        // they are damage.
        if (s.avail_in == 0) break;
        problem("is followed by " + std::to_string(s.avail_in) + " bytes after its end");
      }
      // As Python's gzip module: zero bytes after a member are skipped, then the next member
      // read, if there is one.
      while (s.avail_in > 0 && *s.next_in == 0) {
        ++s.next_in;
        --s.avail_in;
      }
      if (s.avail_in == 0) break;
      inflateReset(&s);
      continue;
    }
    if (rc == Z_BUF_ERROR) {
      // No progress possible: the output is full, or the input ended before the stream did.
      if (s.avail_in == 0) problem("is truncated (the stream ends early)");
      problem("decompresses to more than " + std::to_string(out_size) + " bytes");
    }
    if (rc == Z_MEM_ERROR) throw Error(name + ": out of memory while decompressing " + what);
    const std::string why = s.msg != nullptr ? s.msg : "code " + std::to_string(rc);
    problem("is corrupt (" + why + ")");
  }
  const size_t got = out_size - s.avail_out;
  if (got != out_size) problem("decompresses to " + std::to_string(got) + " bytes");
}

}  // namespace

Compressor Compressor::parse(const std::string& text) {
  const auto fail = [&](const std::string& problem) -> InputError {
    return InputError("compressor '" + text + "': " + problem +
                      "; expected none, zstd[:LEVEL], gzip[:LEVEL], zlib[:LEVEL] or "
                      "blosc-CNAME[-SHUFFLE][:LEVEL] with CNAME lz4, lz4hc, blosclz, zstd or zlib "
                      "and SHUFFLE shuffle, noshuffle or bitshuffle");
  };
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  Compressor c;
  if (name == "none") {
    if (colon != std::string::npos) throw fail("'none' takes no level");
    return c;
  }
  if (name == "zstd") {
    c.kind = Kind::Zstd;
    c.level = kDefaultZstdLevel;
  } else if (name == "gzip") {
    c.kind = Kind::Gzip;
    c.level = kDefaultGzipLevel;
  } else if (name == "zlib") {
    c.kind = Kind::Zlib;
    c.level = kDefaultZlibLevel;
  } else if (name.rfind("blosc-", 0) == 0) {
    c.kind = Kind::Blosc;
    c.level = kDefaultBloscLevel;
    if (!parse_blosc_name(name.substr(6), c)) throw fail("unknown blosc compressor or shuffle");
  } else {
    throw fail("unknown compressor");
  }
  if (colon != std::string::npos && !parse_int(text.substr(colon + 1), c.level)) {
    throw fail("the level is not an integer");
  }
  std::string problem = detail::compressor_problem(c);
  if (problem.empty()) problem = detail::unwritable_compressor_problem(c);
  if (!problem.empty()) throw fail(problem);
  return c;
}

std::string Compressor::describe() const {
  const std::string checksum = crc32c ? "+crc32c" : "";
  switch (kind) {
    case Kind::None: return "none" + checksum;
    case Kind::Zstd: return "zstd:" + std::to_string(level) + checksum;
    case Kind::Blosc:
      return "blosc-" + blosc_cname + shuffle_suffix(blosc_shuffle) + ":" +
             std::to_string(level) + checksum;
    case Kind::Gzip: return "gzip:" + std::to_string(level) + checksum;
    case Kind::Zlib: return "zlib:" + std::to_string(level) + checksum;
  }
  return "unknown";
}

namespace detail {

std::string compressor_read_problem(const Compressor& c) {
  if (c.kind != Compressor::Kind::Blosc) return "";
  // compname_to_compcode also says whether this build of the library has the compressor.
  if (blosc_compname_to_compcode(c.blosc_cname.c_str()) < 0) {
    return "blosc compressor '" + c.blosc_cname + "' is not available; expected one this " +
           "libblosc has: " + available_blosc_compressors();
  }
  // Not used to decode (blosc's header has its own), but shown (describe(), tandem inspect):
  // a shuffle of 7 would read as byte shuffle.
  if (c.blosc_shuffle < BLOSC_NOSHUFFLE || c.blosc_shuffle > BLOSC_BITSHUFFLE) {
    return "blosc shuffle " + std::to_string(c.blosc_shuffle) + " is not 0, 1 or 2";
  }
  if (c.blosc_blocksize < 0) {
    return "blosc blocksize " + std::to_string(c.blosc_blocksize) + " is negative";
  }
  return "";
}

std::string compressor_problem(const Compressor& c) {
  const std::string unreadable = compressor_read_problem(c);
  if (!unreadable.empty()) return unreadable;
  switch (c.kind) {
    case Compressor::Kind::None: return "";
    case Compressor::Kind::Zstd:
      if (c.level < ZSTD_minCLevel() || c.level > ZSTD_maxCLevel()) {
        return "zstd level " + std::to_string(c.level) + " is out of range " +
               std::to_string(ZSTD_minCLevel()) + " to " + std::to_string(ZSTD_maxCLevel());
      }
      return "";
    case Compressor::Kind::Blosc:
      if (c.level < 0 || c.level > 9) {
        return "blosc clevel " + std::to_string(c.level) + " is out of range 0 to 9";
      }
      return "";
    case Compressor::Kind::Gzip:
    case Compressor::Kind::Zlib:
      if (c.level < 0 || c.level > 9) {
        return std::string(deflate_name(c.kind)) + " level " + std::to_string(c.level) +
               " is out of range 0 to 9";
      }
      return "";
  }
  return "unknown compressor kind";
}

std::string unwritable_compressor_problem(const Compressor& c) {
  if (c.crc32c) return "the crc32c codec is read (checked and stripped), not written";
  if (c.kind != Compressor::Kind::Blosc || c.blosc_cname != "snappy") return "";
  return "blosc-snappy stores are read but not written: zarr-python 3's numcodecs (from PyPI) is "
         "built without snappy and could not read them";
}

size_t max_stored_size(const Compressor& c, size_t chunk_bytes) {
  return max_stored_size_of_parts(c, 1, chunk_bytes);
}

size_t max_stored_size_of_parts(const Compressor& c, size_t parts, size_t part_bytes) {
  const size_t checksum = c.crc32c ? 4 : 0;
  switch (c.kind) {
    case Compressor::Kind::None: return parts * (part_bytes + checksum);
    case Compressor::Kind::Zstd: return parts * (ZSTD_compressBound(part_bytes) + checksum);
    case Compressor::Kind::Blosc: return parts * (part_bytes + BLOSC_MAX_OVERHEAD + checksum);
    case Compressor::Kind::Gzip:
    case Compressor::Kind::Zlib: {
      // A gzip header of another writer (a name, a comment, several members) once per file, a
      // plain one per part.
      const size_t bound = compressBound(uLong(std::min<size_t>(part_bytes, ULONG_MAX >> 1)));
      return parts * (bound + kDeflatePartHeader + checksum) + kDeflateWrapperSlack;
    }
  }
  return parts * (part_bytes + checksum);
}

}  // namespace detail

std::vector<uint8_t> compress(const Compressor& c, const uint8_t* data, size_t size,
                              size_t type_size) {
  const std::string problem = detail::compressor_problem(c);
  if (!problem.empty()) throw InputError("compressor '" + c.describe() + "': " + problem);
  switch (c.kind) {
    case Compressor::Kind::None: return std::vector<uint8_t>(data, data + size);
    case Compressor::Kind::Zstd: return compress_zstd(c, data, size);
    case Compressor::Kind::Blosc: return compress_blosc(c, data, size, type_size);
    case Compressor::Kind::Gzip:
    case Compressor::Kind::Zlib: return compress_deflate(c, data, size);
  }
  throw Error("unknown compressor kind");
}

void decompress(const Compressor& c, const uint8_t* in, size_t in_size, uint8_t* out,
                size_t out_size, const std::string& what) {
  if (c.crc32c) {
    if (in_size < 4) {
      corrupt(what, "chunk is " + std::to_string(in_size) + " bytes, shorter than its 4-byte "
                    "crc32c checksum");
    }
    in_size -= 4;
    const uint32_t stored = uint32_t(in[in_size]) | uint32_t(in[in_size + 1]) << 8 |
                            uint32_t(in[in_size + 2]) << 16 | uint32_t(in[in_size + 3]) << 24;
    const uint32_t computed = crc32c(in, in_size);
    if (stored != computed) {
      char text[96];
      std::snprintf(text, sizeof(text), "crc32c checksum is %08x, the data's is %08x", stored,
                    computed);
      corrupt(what, std::string(text) + " (the chunk is corrupt)");
    }
  }
  switch (c.kind) {
    case Compressor::Kind::None:
      if (in_size != out_size) {
        corrupt(what, "uncompressed chunk is " + std::to_string(in_size) + " bytes; expected " +
                          std::to_string(out_size) + " bytes (the chunk size)");
      }
      if (out_size > 0) std::memcpy(out, in, out_size);
      return;
    case Compressor::Kind::Zstd: return decompress_zstd(in, in_size, out, out_size, what);
    case Compressor::Kind::Blosc: return decompress_blosc(in, in_size, out, out_size, what);
    case Compressor::Kind::Gzip:
    case Compressor::Kind::Zlib:
      return decompress_deflate(c.kind, in, in_size, out, out_size, what);
  }
  throw Error(what + ": unknown compressor kind");
}

}  // namespace tandem::zarr
