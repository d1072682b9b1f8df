// Which of a parameter server's checkpoint files (SHARD-step-N.safetensors in the run's
// checkpoint directory) it resumes from: the newest that reads back whole, older ones standing
// in for a newer one that was damaged. The server restores through it; `tandem launch --resume`
// asks it beforehand which step each server will resume at.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ps_checkpoint_file.h"

namespace tandem {

// A server's checkpoint file name, SHARD-step-STEP.safetensors (STEP: 1 to 18 digits), as
// (SHARD, STEP); nullopt for any other name.
std::optional<std::pair<std::string, int64_t>> shard_checkpoint_name(const std::string& name);

// `shard`'s checkpoint files in `dir`, newest (highest step in the name) first.
std::vector<std::pair<int64_t, std::string>> list_shard_checkpoints(const std::string& dir,
                                                                    const std::string& shard);

struct CheckpointChoice {
  std::string path;  // the file taken; empty when none was
  int64_t step = -1;
  // Each file passed over (unreadable, damaged, of another optimizer, or refused by the
  // caller), with why, newest first.
  std::vector<std::pair<std::string, std::string>> skipped;

  // Empty when a file was taken or there were none; otherwise the InputError text for a server
  // that has checkpoints and none it can resume from.
  std::string refusal(const std::string& shard, const std::string& dir) const;
};

// Offers `shard`'s checkpoints in `dir` that decode (decode_shard_checkpoint) to `take`, newest
// first, until `take` returns; an exception from reading, decoding or `take` passes that file
// over for the next, but ShardDeviceFailed (the GPU, not the file), which ends the search.
CheckpointChoice choose_shard_checkpoint(
    const std::string& dir, const std::string& shard, bool adam,
    const std::function<void(ShardCheckpoint&&, const std::string& path)>& take);

// Where `tandem launch --resume` goes on, each of the run's servers (ps0 .. ps<servers - 1>)
// resuming from its newest checkpoint that reads back whole, as the servers will choose (through
// choose_shard_checkpoint). InputError for a server with checkpoints and none it can resume from.
struct ResumePoint {
  int64_t step = -1;          // the lowest of the servers' steps (-1: none has a checkpoint)
  int64_t highest_step = -1;  // the highest: servers at different steps mix two points of a run
  // The epochs every server's checkpoint holds (their epochs_whole): 0 when a server has none (it
  // starts empty: only the first Init fills it) or one's checkpoint does not say.
  int64_t epochs = 0;
  std::string steps;  // "ps0 at step N, ps1 at step M (a newer checkpoint of it does not ...)"
  std::vector<std::string> without_checkpoint;  // servers that start empty
  bool epochs_unsaid = false;  // a checkpoint taken says nothing of its epochs (older version)
  // Each server's checkpoint's parts, (name, shape) in the file's order; none for one without.
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> parts;
};
ResumePoint resume_point_of_servers(const std::string& dir, int servers, bool adam);

}  // namespace tandem
