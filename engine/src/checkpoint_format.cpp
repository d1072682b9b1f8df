#include "checkpoint_format.h"

#include <filesystem>

#include "safetensors.h"
#include "tandem/error.h"

namespace tandem {

std::string why_not_a_checkpoint(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return "";
  // A device or a FIFO (read, a FIFO would wait for a writer) is the writer's to refuse.
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  try {
    const SafeTensorsFile file = read_safetensors(path);
    const auto format = file.metadata.find("format");
    if (format == file.metadata.end()) return "its metadata names no format";
    if (format->second != kCheckpointFormat) return "its format is '" + format->second + "'";
    return "";
  } catch (const Error& e) {
    // The reader's message names the file first ("PATH: ..."): named once, by the caller.
    const std::string what = e.what();
    return what.rfind(path + ": ", 0) == 0 ? what.substr(path.size() + 2) : what;
  }
}

void refuse_to_write_over_other_than_a_checkpoint(const std::string& path,
                                                  const std::string& what) {
  const std::string why = why_not_a_checkpoint(path);
  if (!why.empty())
    throw InputError(what + " " + path + " exists and is not a Tandem checkpoint (" + why +
                     "): refusing to write over it; remove it, or give another path");
}

}  // namespace tandem
