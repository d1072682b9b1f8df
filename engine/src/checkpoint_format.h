// The format a Tandem checkpoint names in its safetensors metadata ("format"), its version, and
// what may be written over by a checkpoint.
#pragma once

#include <string>

namespace tandem {

constexpr const char* kCheckpointFormat = "tandem-checkpoint";
constexpr const char* kCheckpointFormatVersion = "1";

// "" when nothing is at `path`, it holds a Tandem checkpoint (its metadata names the format) or it
// is no regular file (a device, a FIFO, a directory: the writer's checks refuse those); otherwise
// what it holds instead ("its metadata names no format", or the reader's error: an IDX file,
// notes).
std::string why_not_a_checkpoint(const std::string& path);

// A checkpoint's path given as `what` (--checkpoint, model_out): InputError unless
// why_not_a_checkpoint is "" (a data file once went under a model written over it).
void refuse_to_write_over_other_than_a_checkpoint(const std::string& path,
                                                  const std::string& what);

}  // namespace tandem
