#include "ps_checkpoint_choice.h"

#include <algorithm>
#include <filesystem>

#include "safetensors.h"
#include "tandem/error.h"

namespace tandem {

std::optional<std::pair<std::string, int64_t>> shard_checkpoint_name(const std::string& name) {
  const std::string infix = "-step-", suffix = ".safetensors";
  const size_t at = name.rfind(infix);
  if (at == std::string::npos || at == 0 || name.size() <= at + infix.size() + suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string digits =
      name.substr(at + infix.size(), name.size() - at - infix.size() - suffix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::make_pair(name.substr(0, at), std::stoll(digits));
}

std::vector<std::pair<int64_t, std::string>> list_shard_checkpoints(const std::string& dir,
                                                                    const std::string& shard) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto named = shard_checkpoint_name(it->path().filename().string());
    if (named && named->first == shard) out.emplace_back(named->second, it->path().string());
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

ResumePoint resume_point_of_servers(const std::string& dir, int servers, bool adam) {
  ResumePoint point;
  int64_t fewest_epochs = -1;
  for (int i = 0; i < servers; ++i) {
    const std::string shard = "ps" + std::to_string(i);
    int64_t epochs = -1;  // of the file taken: the last one offered
    std::vector<std::pair<std::string, std::vector<int64_t>>> parts;
    const CheckpointChoice choice = choose_shard_checkpoint(
        dir, shard, adam, [&](ShardCheckpoint&& c, const std::string&) {
          epochs = c.epochs_whole;
          parts.clear();
          for (const auto& t : c.tensors) parts.emplace_back(t.name, t.shape);
        });
    point.parts.push_back(choice.path.empty() ? decltype(parts){} : std::move(parts));
    const std::string refusal = choice.refusal(shard, dir);
    if (!refusal.empty()) throw InputError(refusal);
    if (choice.path.empty()) {
      point.without_checkpoint.push_back(shard);
      continue;
    }
    point.step = point.step < 0 ? choice.step : std::min(point.step, choice.step);
    point.highest_step = std::max(point.highest_step, choice.step);
    if (epochs < 0) point.epochs_unsaid = true;
    fewest_epochs = fewest_epochs < 0 ? std::max<int64_t>(0, epochs)
                                      : std::min(fewest_epochs, std::max<int64_t>(0, epochs));
    point.steps += (point.steps.empty() ? "" : ", ") + shard + " at step " +
                   std::to_string(choice.step) +
                   (choice.skipped.empty() ? "" : " (a newer checkpoint of it does not read back)");
  }
  point.epochs = point.without_checkpoint.empty() ? std::max<int64_t>(0, fewest_epochs) : 0;
  return point;
}

}  // namespace tandem
