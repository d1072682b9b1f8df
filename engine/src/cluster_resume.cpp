#include "cluster_resume.h"

#include <cstdint>
#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "ps_placement.h"
#include "tandem/error.h"

namespace tandem {

bool holds_server_checkpoint(const std::string& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (shard_checkpoint_name(it->path().filename().string())) return true;
  return false;
}

void require_server_checkpoint(const std::string& dir, const std::string& request) {
  if (!holds_server_checkpoint(dir))
    throw InputError(request + ": no parameter server checkpoint in " + dir +
                     " (nothing to continue; leave out " + request + " to start afresh)");
}

namespace {

using Parts = std::vector<std::pair<std::string, std::vector<int64_t>>>;

std::string parts_text(const Parts& parts) {
  constexpr size_t kShown = 4;
  std::string out;
  for (size_t i = 0; i < parts.size() && i < kShown; ++i) {
    out += (i ? ", " : "") + parts[i].first + " [";
    for (size_t d = 0; d < parts[i].second.size(); ++d)
      out += (d ? "x" : "") + std::to_string(parts[i].second[d]);
    out += "]";
  }
  if (parts.size() > kShown) out += ", ... (" + std::to_string(parts.size()) + " parts)";
  return out;
}

// Each server's checkpoint against the parts this run's chief will initialise it with: another
// model or another number of servers was refused by the servers only once every role had
// started, named among the lines of the workers that failed with it.
void refuse_checkpoints_of_another_shape(const ResumePoint& point, const ModelConfig& model,
                                         int servers, const std::string& request) {
  std::vector<Parts> placed(static_cast<size_t>(servers));
  for (const TensorPart& part : place_model_parts(model, servers))
    placed[size_t(part.server)].emplace_back(part.name, part.shape);
  for (size_t i = 0; i < point.parts.size() && i < placed.size(); ++i) {
    if (point.parts[i].empty()) continue;  // starts empty: said by the resume note
    Parts held = point.parts[i], wanted = placed[i];
    std::sort(held.begin(), held.end());
    std::sort(wanted.begin(), wanted.end());
    if (held == wanted) continue;
    throw InputError(request + ": ps" + std::to_string(i) + "'s checkpoint holds " +
                     parts_text(point.parts[i]) + ", where this run (model " + model.describe() +
                     " on " + std::to_string(servers) + " server" + (servers == 1 ? "" : "s") +
                     ") places " + parts_text(placed[i]) + ": resume with the model and the "
                     "number of servers the checkpoints were written with, or start afresh");
  }
}

}  // namespace

ResumePoint resume_point_of_run(const RunSettings& settings, int servers,
                                const std::string& request) {
  if (settings.checkpoint_dir.empty())
    throw InputError(request + " needs the settings' checkpoint_dir, where the servers' "
                     "checkpoints are");
  require_server_checkpoint(settings.checkpoint_dir, request);
  ResumePoint point;
  try {
    point = resume_point_of_servers(settings.checkpoint_dir, servers,
                                    settings.optimizer.kind == OptimizerKind::Adam);
  } catch (const InputError& e) {
    throw InputError(request + ": " + e.what());
  }
  refuse_checkpoints_of_another_shape(point, settings.model, servers, request);
  return point;
}

std::string resume_note(const ResumePoint& point, int64_t max_epochs,
                        const std::string& limit_name, bool evaluated_at_the_end) {
  std::string note;
  if (point.step != point.highest_step)
    note += "tandem: the parameter servers resume at different steps: " + point.steps + "\n";
  if (!point.without_checkpoint.empty()) {
    std::string names;
    for (const std::string& n : point.without_checkpoint) names += (names.empty() ? "" : ", ") + n;
    note += "tandem: " + names + " ha" + (point.without_checkpoint.size() == 1 ? "s" : "ve") +
            " no checkpoint and start" + (point.without_checkpoint.size() == 1 ? "s" : "") +
            " empty (the first Init's parameters): the epochs count from the first again\n";
  } else if (point.epochs_unsaid) {
    note += "tandem: a server's checkpoint does not say which epochs it holds (an older "
            "version's): the epochs count from the first again\n";
  }
  if (point.epochs == 0) return note;
  const std::string held = "tandem: the servers' checkpoints come after " +
                           std::to_string(point.epochs) + " epoch" +
                           (point.epochs == 1 ? "" : "s");
  if (max_epochs > 0 && max_epochs <= point.epochs)
    return note + held + ", and " + limit_name + " " + std::to_string(max_epochs) +
           " counts the run's epochs in all: nothing to train" +
           (evaluated_at_the_end ? ", the servers' parameters are evaluated" : "") + "\n";
  return note + held + ": training goes on with epoch " + std::to_string(point.epochs + 1) +
         " (what was trained after them before the checkpoints, of that epoch or a later one, "
         "is trained again)\n";
}

RunStart start_of_run(const RunSettings& settings, int servers, int64_t max_epochs, bool resume,
                      const std::string& request, bool evaluated_at_the_end) {
  RunStart start;
  if (!resume) {
    refuse_checkpoints_not_asked_for(settings, request);
    return start;
  }
  const ResumePoint point = resume_point_of_run(settings, servers, request);
  start.first_epoch = point.epochs;
  start.note = resume_note(point, max_epochs, "max_epochs", evaluated_at_the_end);
  return start;
}

void refuse_checkpoints_not_asked_for(const RunSettings& settings, const std::string& request) {
  if (!settings.checkpoint_dir.empty() && holds_server_checkpoint(settings.checkpoint_dir))
    throw InputError("checkpoint_dir " + settings.checkpoint_dir + " holds parameter server " +
                     "checkpoints, which this run's servers would start from while its epochs "
                     "counted from the first (" + request + " continues that run; or give a "
                     "directory without them)");
}

}  // namespace tandem
