// What a parameter server's checkpoint file holds, as a safetensors file: every parameter of the
// shard under its name, float32, with Adam's moments beside it as NAME.adam_m and NAME.adam_v,
// and metadata naming the format ("tandem-ps-shard"), the step, the mode, the shard, the
// optimizer, the model's parameter order and, in a cluster run, the epochs the parameters hold
// whole (epochs_whole: `launch --resume` goes on after them). Pure encoding and decoding; the
// server reads and writes the files (ps_server.cpp, ps_checkpoint_writer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ps_shard.h"
#include "safetensors.h"

namespace tandem {

// A checkpoint's content, ready for PsShard::restore.
struct ShardCheckpoint {
  int64_t step = 0;
  std::string model_order;  // the first Init's extra (empty in files from older versions)
  int64_t epochs_whole = -1;  // -1: not said (a server outside a cluster run, an older version)
  std::vector<PsShard::Restored> tensors;
};

// The labels written beside the numbers; model_order and epochs_whole are read back.
struct ShardCheckpointLabels {
  std::string mode;       // "async", "sync", "bounded_staleness"
  std::string shard;      // the shard's name
  std::string optimizer;  // "adam", "sgd"
  std::string model_order;
  int64_t epochs_whole = -1;  // -1: not written
};

// The shard's parameters (and, for Adam, its moments: fetch them from a GPU first) as a file.
SafeTensorsFile encode_shard_checkpoint(const PsShard& shard, bool adam,
                                        const ShardCheckpointLabels& labels);

// Why `name` cannot be a parameter's in these files, or "": one ending in a moment's suffix
// would be read back as a moment, and safetensors keeps "__metadata__" (the server refuses such
// an Init: its checkpoints could not be restored).
std::string reserved_parameter_name_problem(const std::string& name);

// A file's content, checked whole: InputError naming `path` for another format, a step that is
// not a number, a tensor that is not float32 or not finite, a moment that does not match its
// parameter or has none, missing moments when `adam`, or no parameters at all.
ShardCheckpoint decode_shard_checkpoint(const SafeTensorsFile& file, const std::string& path,
                                        bool adam);

}  // namespace tandem
