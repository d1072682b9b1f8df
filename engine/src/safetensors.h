// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors), the
// file format Tandem uses for model weights so that Python tools can load them directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem {

// One named tensor. `data` holds the raw little-endian bytes, product(shape) * dtype size of
// them; an empty shape is a 0-d scalar with one element.
struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "F64", "I64", "I32", "U8", "I8", "I16", "U16", "BF16", "F16", "BOOL"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

struct SafeTensorsFile {
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" block
  std::vector<SafeTensor> tensors;              // written in this order; read back in file order

  const SafeTensor* find(const std::string& name) const;  // nullptr if absent
};

// Bytes per element of a safetensors dtype; InputError for a dtype this code does not know.
size_t safetensors_dtype_size(const std::string& dtype);

// Writes to temp_path(path) in the same directory, fsyncs it, renames it over `path` and
// fsyncs the directory, so a crash leaves either the old file or the new one, never a mix.
// Validates first (InputError): data sizes match shapes, names are unique, no tensor is called
// "__metadata__". On any failure the temporary file is removed and an existing file at `path`
// is left untouched (IoError for operating-system failures). Two threads writing the same path at
// once each write their own temporary file; the later rename wins.
void write_safetensors_atomic(const std::string& path, const SafeTensorsFile& file);

// Reads and validates the whole file; never returns a partially loaded result. InputError (with
// the path and the problem) for a malformed file, IoError when it cannot be opened or read.
SafeTensorsFile read_safetensors(const std::string& path);

// The same format as bytes in memory, for a file that travels between processes rather than
// through a file system (a search trial's state moving to another Dask worker). The same checks
// as writing and reading a file; `name` stands for the path in error messages.
std::vector<uint8_t> encode_safetensors(const SafeTensorsFile& file, const std::string& name);
SafeTensorsFile decode_safetensors(const uint8_t* data, size_t size, const std::string& name);

}  // namespace tandem
