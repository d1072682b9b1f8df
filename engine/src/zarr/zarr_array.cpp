// Zarr arrays and groups on the local filesystem: finding and reading metadata, chunk keys, chunk
// files, and atomic writes. Metadata parsing lives in zarr_metadata.cpp, codecs in
// zarr_codecs.cpp.
#include "zarr/zarr_array.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <utility>

#include "file_io.h"
#include "mapped_read_guard.h"
#include "tandem/error.h"
#include "zarr/zarr_metadata.h"
#include "zarr/zarr_stored_chunks.h"

namespace tandem::zarr {
namespace {

// Chunk bytes go between memory and disk unswapped, and Tandem's Zarr data is little-endian.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Zarr I/O needs a little-endian host");
#else
#error "cannot tell this compiler's byte order; Zarr I/O needs a little-endian host"
#endif

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

[[noreturn]] void store_error(const std::string& store, const std::string& problem) {
  throw InputError("zarr store '" + store + "': " + problem);
}

// "dir/" and "dir" name the same store; messages and keys use the form without the slash.
std::string normalize(const std::string& path) {
  if (path.empty()) throw InputError("zarr store '': empty path; expected a directory");
  return without_trailing_slashes(path);
}

// What read_exact throws when a file of `what` (the store and the file) is shorter than its size.
std::string ended_early(const std::string& what) {
  return what + ": file ended early (was it changed while being read?)";
}

// `mkdir -p`. Concurrent writers may race to create the same directory: EEXIST is success.
void make_directories(const std::string& path) {
  // Each prefix ending before a '/' (a leading '/' is skipped), then the whole path.
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) == 0) continue;
    const int err = errno;
    struct stat st {};
    if (err != EEXIST) io_error("create directory", prefix, err);
    if (::stat(prefix.c_str(), &st) != 0) io_error("stat", prefix, errno);
    if (!S_ISDIR(st.st_mode)) {
      throw InputError("cannot create directory '" + prefix + "': a file of that name exists");
    }
  }
}

bool file_exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  io_error("stat", path, errno);
}

// The data is always fsynced before the rename, so a crash cannot publish an empty or torn file.
// The directory is fsynced after it (the rename itself survives a crash) for metadata only.
enum class Durability { Data, DataAndDirectory };

// Writes through "<path>.tmp-<pid>-<tid>" and a rename, so readers see the old file or the new
// one, never part of one, and two threads or processes never share a temporary file.
void write_file_atomic(const std::string& path, const void* data, size_t size,
                       Durability durability) {
  AtomicFile out(path);
  out.write(data, size);
  out.commit();
  if (durability == Durability::DataAndDirectory) fsync_parent_directory(out.target(), "writing");
}

// A metadata document as zarr-python formats it (indented, non-ASCII characters as \u escapes),
// written atomically and durably. Escaped because zarr 2.13 decodes .zattrs as ASCII: a path
// with an accent in the attributes made them unreadable there. A string that is not UTF-8 (a
// path of Latin-1 bytes) is written with U+FFFD for its bad bytes: JSON cannot hold it.
template <typename Json>
void write_metadata(const std::string& store, const std::string& name, const Json& doc) {
  const std::string text = doc.dump(2, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
  write_file_atomic(store + "/" + name, text.data(), text.size(), Durability::DataAndDirectory);
}

// The text of the store's metadata file `name`, or nullopt when there is none.
std::optional<std::string> read_metadata_file(const std::string& store, const std::string& name) {
  const std::string path = store + "/" + name;
  // O_NONBLOCK: a FIFO in the file's place opens at once, to be refused below, instead of
  // blocking forever. Regular files read as ever.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    io_error("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io_error("stat", path, errno);
  if (!S_ISREG(st.st_mode)) detail::metadata_error(store, name, "not a regular file");
  if (uint64_t(st.st_size) > detail::kMaxMetadataBytes) {
    detail::metadata_error(store, name, "file is " + std::to_string(st.st_size) +
                                            " bytes; expected at most " +
                                            std::to_string(detail::kMaxMetadataBytes));
  }
  std::string text(size_t(st.st_size), '\0');
  read_exact(fd.get(), text.data(), text.size(), path,
             ended_early("zarr store '" + store + "', metadata '" + name + "'"));
  return text;
}

// Parses a metadata file with `parse`; a JSON library exception escaping the field checks would
// be a bug there, but still becomes an InputError naming the file rather than a stray exception.
template <typename Parse>
auto parse_guarded(const std::string& store, const std::string& name, Parse parse) {
  try {
    return parse();
  } catch (const nlohmann::json::exception& e) {
    detail::metadata_error(store, name, std::string("unexpected JSON structure (") + e.what() + ")");
  }
}

json read_attributes_v2(const std::string& store) {
  const auto text = read_metadata_file(store, ".zattrs");
  if (!text) return json::object();
  return detail::parse_metadata_text(store, ".zattrs", *text);  // checks it is an object
}

// Refuses to create a node over an existing one (any of `names`): mixing an old array's chunks
// into new data would be silent corruption.
void refuse_existing(const std::string& store, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (file_exists(store + "/" + name)) {
      store_error(store, std::string("already holds a Zarr node ('") + name +
                             "'); expected a new or empty directory");
    }
  }
}

// Chunk file `file` open for reading, its size in `size`; -1 when there is none (the fill
// value). O_NONBLOCK, as for metadata files: a FIFO in its place is refused, not waited on.
// IoError for a failure to open, InputError "WHAT: not a regular file".
int open_chunk_file(const std::string& file, const std::string& what, uint64_t& size) {
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) return -1;
    io_error("open", file, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io_error("stat", file, errno);
  if (!S_ISREG(st.st_mode)) throw InputError(what + ": not a regular file");
  size = uint64_t(st.st_size);
  return fd.release();
}

}  // namespace

// A directory with zarr.json beside v2 metadata (`v2_file`): zarr-python goes by the format of
// the group it opens from, which Tandem does not know here. Taking zarr.json read a v2 array
// with a stray zarr.json as fill values only (its chunks are not under c/), without a word.
namespace {
void refuse_both_formats(const std::string& store, const std::string& v2_file) {
  if (file_exists(store + "/" + v2_file))
    store_error(store, "holds both zarr.json (Zarr v3) and " + v2_file + " (Zarr v2), and which "
                       "one describes it is ambiguous; remove the one that does not");
}
}  // namespace

Array Array::open(const std::string& path) {
  Array a;
  a.path_ = normalize(path);
  const std::string& store = a.path_;
  // The directory's identity before its metadata is read: a store swapped in between is caught
  // by the first chunk read (check_still_there).
  struct stat st {};
  if (::stat(store.c_str(), &st) == 0) {
    a.directory_device_ = uint64_t(st.st_dev);
    a.directory_inode_ = uint64_t(st.st_ino);
  }
  if (const auto v3 = read_metadata_file(store, "zarr.json")) {
    refuse_both_formats(store, ".zarray");
    a.meta_ = parse_guarded(store, "zarr.json", [&] {
      return detail::parse_v3_array(store, detail::parse_metadata_text(store, "zarr.json", *v3));
    });
  } else if (const auto v2 = read_metadata_file(store, ".zarray")) {
    a.meta_ = parse_guarded(store, ".zarray", [&] {
      return detail::parse_v2_array(store, detail::parse_metadata_text(store, ".zarray", *v2));
    });
    a.meta_.attributes = read_attributes_v2(store);
  } else if (file_exists(store + "/.zgroup")) {
    store_error(store, "is a Zarr group, not an array");
  } else {
    store_error(store, "no Zarr array here (neither zarr.json nor .zarray); expected an array "
                       "written by zarr-python, dask or Tandem");
  }
  return a;
}

void Array::check_still_there(const std::string& what) const {
  if (directory_inode_ == 0) return;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    // Gone is what this is about; any other failure (permissions, a stale NFS handle) is said
    // as it is.
    if (errno != ENOENT && errno != ENOTDIR) io_error("stat", path_, errno);
  } else if (uint64_t(st.st_dev) == directory_device_ &&
             uint64_t(st.st_ino) == directory_inode_) {
    return;
  }
  throw InputError(what + ": the array's directory was removed or replaced while it was being "
                   "read (another `tandem prepare --overwrite`, or the store deleted); what was "
                   "read may mix two stores, so the reading stops here");
}

Array Array::create(const std::string& path, const ArrayMeta& meta) {
  Array a;
  a.path_ = normalize(path);
  a.meta_ = meta;
  const std::string& store = a.path_;
  detail::check_array_meta(store, meta.format == Format::V3 ? "zarr.json" : ".zarray", meta,
                           detail::Purpose::Create);
  const std::string unwritable = detail::unwritable_compressor_problem(meta.compressor);
  if (!unwritable.empty()) store_error(store, unwritable);
  make_directories(store);
  refuse_existing(store, {"zarr.json", ".zarray", ".zgroup"});
  if (meta.format == Format::V3) {
    write_metadata(store, "zarr.json", detail::v3_array_json(meta));
  } else {
    // Attributes first: once .zarray appears the array is complete. Always written, so no stale
    // .zattrs from an earlier attempt survives.
    write_metadata(store, ".zattrs", meta.attributes);
    write_metadata(store, ".zarray", detail::v2_array_json(meta));
  }
  return a;
}

std::string Array::chunk_key(const std::vector<int64_t>& index) const {
  const std::vector<int64_t> grid = meta_.grid();
  bool inside = index.size() == grid.size();
  for (size_t i = 0; inside && i < index.size(); ++i) inside = index[i] >= 0 && index[i] < grid[i];
  if (!inside) {
    store_error(path_, "chunk index " + detail::dims_text(index) + " is outside the chunk grid " +
                           detail::dims_text(grid) + "; expected " + std::to_string(grid.size()) +
                           " indices each below the grid's");
  }
  const std::string sep(1, meta_.separator);
  // v3 default encoding: "c" then each index after a separator ("c" alone for 0-d arrays).
  if (meta_.format == Format::V3 && meta_.v3_default_key_encoding) {
    std::string key = "c";
    for (const int64_t i : index) key += sep + std::to_string(i);
    return key;
  }
  // v2 (and the v3 "v2" encoding): indices joined by the separator, "0" for 0-d arrays.
  if (index.empty()) return "0";
  std::string key;
  for (size_t i = 0; i < index.size(); ++i) key += (i ? sep : "") + std::to_string(index[i]);
  return key;
}

bool Array::read_chunk(const std::vector<int64_t>& index, uint8_t* out) const {
  const std::string key = chunk_key(index);
  const bool found = read_chunk_file(key, out);
  // After the read: a store replaced before it read the other store's chunk, one removed gave
  // the fill value. Replaced after it, the read was of this store's file, which is fine.
  check_still_there("zarr store '" + path_ + "', chunk '" + key + "'");
  return found;
}

bool Array::read_chunk_file(const std::string& key, uint8_t* out) const {
  const std::string file = path_ + "/" + key;
  const std::string what = "zarr store '" + path_ + "', chunk '" + key + "'";
  const size_t size = meta_.chunk_bytes();
  uint64_t stored = 0;
  Fd fd(open_chunk_file(file, what, stored));
  if (fd.get() < 0) {  // zarr-python and dask leave out chunks that hold only the fill value
    detail::fill_chunk(meta_, out);
    return false;
  }
  // The file size is checked before anything is allocated for it: a huge file is corrupt.
  const size_t limit = detail::max_stored_chunk_size(meta_);
  if (stored > limit) {
    throw InputError(what + ": chunk file is " + std::to_string(stored) + " bytes; expected at most " +
                     std::to_string(limit) + " for a " + std::to_string(size) + "-byte chunk (" +
                     meta_.compressor.describe() + ")");
  }
  if (meta_.stored_plain()) {
    if (stored != size) {
      throw InputError(what + ": uncompressed chunk is " + std::to_string(stored) +
                       " bytes; expected " + std::to_string(size) + " bytes (the chunk size)");
    }
    read_exact(fd.get(), out, size, file, ended_early(what));
    return true;
  }
  // A large chunk's file is mapped, not read: the decompressor reads it straight from the page
  // cache instead of from a copy in a fresh buffer. The chunk manager's stream of a zstd store
  // went from 74-83% of the bare decompressor's speed to 81-89% (bench/RESULTS.md). Small files
  // are cheaper to read than to map. Store files are replaced by rename, not rewritten in
  // place; a file something else cut short under the decompressor is a clear error, not SIGBUS.
  if (stored >= kMapChunkFilesFrom) {
    const MappedFile mapped = MappedFile::map_open(fd.get(), size_t(stored), file);
    const MappedReadGuard guard(mapped);
    try {
      detail::decode_stored_chunk(meta_, mapped.data(), mapped.size(), out, what);
    } catch (const Error&) {
      guard.check(what);  // the zeros read in place of the missing pages are not the corruption
      throw;
    }
    guard.check(what);
    return true;
  }
  std::vector<uint8_t> data(stored);
  read_exact(fd.get(), data.data(), data.size(), file, ended_early(what));
  detail::decode_stored_chunk(meta_, data.data(), data.size(), out, what);
  return true;
}

MappedFile Array::map_chunk(const std::vector<int64_t>& index) const {
  const std::string key = chunk_key(index);
  MappedFile mapped = map_chunk_file(key);
  check_still_there("zarr store '" + path_ + "', chunk '" + key + "'");  // as read_chunk
  return mapped;
}

MappedFile Array::map_chunk_file(const std::string& key) const {
  const std::string what = "zarr store '" + path_ + "', chunk '" + key + "'";
  if (!meta_.stored_plain())
    throw InputError(what + ": only uncompressed chunks without a checksum or sharding can be "
                     "mapped (this array uses " + meta_.compressor.describe() +
                     (meta_.sharded() ? ", sharded" : "") + ")");
  const std::string file = path_ + "/" + key;
  uint64_t stored = 0;
  Fd fd(open_chunk_file(file, what, stored));
  if (fd.get() < 0) return MappedFile();  // a missing chunk: the fill value
  // The size before mapping: a huge (sparse) file would be mapped and paged in whole first.
  if (stored != meta_.chunk_bytes())
    throw InputError(what + ": uncompressed chunk is " + std::to_string(stored) +
                     " bytes; expected " + std::to_string(meta_.chunk_bytes()) +
                     " bytes (the chunk size)");
  return MappedFile::map_open(fd.get(), size_t(stored), file);
}

void Array::write_chunk(const std::vector<int64_t>& index, const uint8_t* data) const {
  const std::string key = chunk_key(index);
  const std::string file = path_ + "/" + key;
  if (key.find('/') != std::string::npos) make_directories(parent_directory(file));
  const size_t size = meta_.chunk_bytes();
  // The chunk's data is fsynced but not its directory: one directory fsync per chunk would cost
  // as much again, and a store's publisher syncs every directory once before publishing it
  // (dataset_store.cpp, sync_tree), after which no chunk can be lost or torn by a crash.
  if (meta_.stored_plain()) {
    write_file_atomic(file, data, size, Durability::Data);
    return;
  }
  std::vector<uint8_t> stored;
  try {
    stored = detail::encode_stored_chunk(meta_, data);
  } catch (const InputError& e) {  // a level only written, never read: this array's (as opened)
    store_error(path_, "chunk " + key + ": " + e.what());
  }
  write_file_atomic(file, stored.data(), stored.size(), Durability::Data);
}

void Array::set_attributes(const nlohmann::json& attributes) {
  if (!attributes.is_object()) {
    store_error(path_, "attributes must be a JSON object; got " + attributes.dump());
  }
  if (meta_.format == Format::V2) {
    write_metadata(path_, ".zattrs", attributes);
  } else {
    // Rewrites zarr.json keeping every other field (and their order) as it is on disk.
    const auto text = read_metadata_file(path_, "zarr.json");
    if (!text) store_error(path_, "zarr.json has disappeared; expected the array's metadata");
    detail::parse_metadata_text(path_, "zarr.json", *text);  // depth and syntax checks
    ordered_json doc = ordered_json::parse(detail::quote_nonfinite_numbers(*text));
    doc["attributes"] = attributes;
    write_metadata(path_, "zarr.json", doc);
  }
  meta_.attributes = attributes;
}

void Group::create(const std::string& path, Format format, const nlohmann::json& attributes) {
  const std::string store = normalize(path);
  if (!attributes.is_object()) {
    store_error(store, "group attributes must be a JSON object; got " + attributes.dump());
  }
  make_directories(store);
  // Re-creating a group rewrites its attributes; an array there is refused.
  refuse_existing(store, {".zarray"});
  if (const auto text = read_metadata_file(store, "zarr.json")) {
    const json doc = detail::parse_metadata_text(store, "zarr.json", *text);
    if (doc.value("node_type", json()) != "group") {
      store_error(store, "already holds a Zarr array (zarr.json); expected a group or nothing");
    }
  }
  if (format == Format::V3) {
    ordered_json doc;
    doc["zarr_format"] = 3;
    doc["node_type"] = "group";
    doc["attributes"] = attributes;
    write_metadata(store, "zarr.json", doc);
  } else {
    write_metadata(store, ".zattrs", attributes);
    write_metadata(store, ".zgroup", ordered_json{{"zarr_format", 2}});
  }
}

std::pair<Format, nlohmann::json> Group::open(const std::string& path) {
  const std::string store = normalize(path);
  if (const auto text = read_metadata_file(store, "zarr.json")) {
    refuse_both_formats(store, ".zgroup");
    return parse_guarded(store, "zarr.json", [&] {
      const json doc = detail::parse_metadata_text(store, "zarr.json", *text);
      const json format = doc.value("zarr_format", json());
      if (format != 3) {
        detail::metadata_error(store, "zarr.json", "\"zarr_format\" is " + format.dump() +
                                                       "; expected 3");
      }
      const json node_type = doc.value("node_type", json());
      if (node_type != "group") {
        detail::metadata_error(store, "zarr.json", "node_type is " + node_type.dump() +
                                                       "; expected \"group\"");
      }
      const json attributes = doc.value("attributes", json::object());
      if (!attributes.is_object()) {
        detail::metadata_error(store, "zarr.json", "\"attributes\" is not a JSON object");
      }
      return std::make_pair(Format::V3, attributes);
    });
  }
  if (const auto text = read_metadata_file(store, ".zgroup")) {
    const json doc = detail::parse_metadata_text(store, ".zgroup", *text);
    if (doc.value("zarr_format", json()) != 2) {
      detail::metadata_error(store, ".zgroup", "\"zarr_format\" is not 2; expected 2");
    }
    return {Format::V2, read_attributes_v2(store)};
  }
  if (file_exists(store + "/.zarray")) store_error(store, "is a Zarr array, not a group");
  store_error(store, "no Zarr group here (neither zarr.json nor .zgroup)");
}

bool Group::exists(const std::string& path) {
  const std::string store = normalize(path);
  if (file_exists(store + "/.zgroup")) return true;
  try {
    const auto text = read_metadata_file(store, "zarr.json");
    if (!text) return false;
    const json doc = detail::parse_metadata_text(store, "zarr.json", *text);
    return doc.value("node_type", json()) == "group";
  } catch (const InputError&) {
    return false;  // unreadable metadata is not a group; Group::open says what is wrong
  }
}

}  // namespace tandem::zarr
