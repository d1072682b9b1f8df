#include "ps_checkpoint_choice.h"

#include <algorithm>
#include <filesystem>

#include "safetensors.h"

namespace tandem {

std::vector<std::pair<int64_t, std::string>> list_shard_checkpoints(const std::string& dir,
                                                                    const std::string& shard) {
  std::vector<std::pair<int64_t, std::string>> out;
  const std::string prefix = shard + "-step-", suffix = ".safetensors";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.emplace_back(std::stoll(digits), it->path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string CheckpointChoice::refusal(const std::string& shard, const std::string& dir) const {
  if (!path.empty() || skipped.empty()) return "";
  std::string why;
  for (const auto& [file, reason] : skipped) why += (why.empty() ? "" : "; ") + reason;
  // Starting empty instead would train from scratch as if resumed, and the server's first
  // checkpoint would replace the run's.
  return "parameter server " + shard + ": none of its checkpoints in " + dir +
         " can be restored (" + why + "); move them away to start this server afresh";
}

CheckpointChoice choose_shard_checkpoint(
    const std::string& dir, const std::string& shard, bool adam,
    const std::function<void(ShardCheckpoint&&, const std::string& path)>& take) {
  CheckpointChoice choice;
  for (const auto& [step_in_name, path] : list_shard_checkpoints(dir, shard)) {
    try {
      ShardCheckpoint checkpoint = decode_shard_checkpoint(read_safetensors(path), path, adam);
      const int64_t step = checkpoint.step;
      take(std::move(checkpoint), path);
      choice.path = path;
      choice.step = step;
      return choice;
    } catch (const ShardDeviceFailed&) {
      throw;  // the GPU, not the file: every older checkpoint would fail the same way
    } catch (const std::exception& e) {
      choice.skipped.emplace_back(path, e.what());
    }
  }
  return choice;
}

}  // namespace tandem
