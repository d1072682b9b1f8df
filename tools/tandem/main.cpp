// The tandem command: one binary, one subcommand per job. Each subcommand lives in its own file;
// this one only wires them to the command line and turns engine errors into messages.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "blas_kernels.h"
#include "cluster_commands.h"
#include "commands.h"
#include "cuda/cuda_device.h"
#include "group_collective.h"
#include "store_commands.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace {

// "1 device: NVIDIA H200 (sm_90, 139 GiB)", "no usable device" or "not in this build".
std::string cuda_devices_text() {
  if (!TANDEM_WITH_CUDA) return "not in this build";
  int devices = 0;
  try {
    devices = tandem::kernels::cuda_device_count();
  } catch (const std::exception& e) {  // TANDEM_REQUIRE_CUDA set: the reason
    return std::string("no usable device (") + e.what() + ")";
  }
  if (devices == 0) return "no usable device";
  std::string text = std::to_string(devices) + (devices == 1 ? " device: " : " devices: ");
  for (int d = 0; d < devices; ++d)
    text += (d == 0 ? "" : ", ") + tandem::kernels::cuda_device_description(d);
  return text;
}

// "tandem" and the command line's command ("tandem train"): every error says which command
// refused or failed, as the line is read or after.
std::string command_of(const CLI::App& app) {
  std::string command = "tandem";
  for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
  return command;
}

// A CLI11 conversion of a number failed only for a whole-number option ("--ps-timeout 2.5":
// CLI11's text says only that it failed); a word given to a flag or a number option fails too.
bool a_fraction_for_a_whole_number(const CLI::Error& e) {
  if (dynamic_cast<const CLI::ConversionError*>(&e) == nullptr) return false;
  const std::string text = e.what();
  const size_t at = text.rfind(" = ");
  if (at == std::string::npos) return false;
  const std::string value = text.substr(at + 3);
  char* end = nullptr;
  std::strtod(value.c_str(), &end);
  return !value.empty() && end == value.c_str() + value.size();
}

// Edits to turn a into b (Levenshtein), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// What the command line gave that the command does not take, in the order given (CLI11's own
// message listed them last first), each unknown option with the nearest the command has, when
// one is near: "--epoch (did you mean --epochs?)". Empty when everything was taken.
std::string not_taken(const CLI::App& top) {
  const CLI::App* command = &top;
  for (const CLI::App* sub : top.get_subcommands()) command = sub;
  const std::vector<std::string> extras = command->remaining();
  std::string out;
  for (const std::string& word : extras) {
    out += (out.empty() ? "" : " ") + word;
    if (word.rfind("--", 0) != 0) continue;
    const std::string name = word.substr(2, word.find('=') - 2);
    std::string nearest;
    // At most two edits away, and fewer than half its letters ("--bar" is no "--lr").
    size_t best = std::min<size_t>(3, (name.size() + 1) / 2);
    for (const CLI::Option* option : command->get_options()) {
      for (const std::string& known : option->get_lnames()) {
        const size_t d = edit_distance(name, known);
        if (d < best) best = d, nearest = "--" + known;
      }
    }
    if (!nearest.empty()) out += " (did you mean " + nearest + "?)";
  }
  return out;
}

// CLI11's text for an error, said the way the rest of the command's errors are.
std::string parse_error_text(const CLI::App& top, const CLI::Error& e) {
  // An option the command does not have ("--modle") is the error to say: CLI11 checked the
  // required options first, and said only "--model is required".
  const std::string extras = not_taken(top);
  if (!extras.empty()) return "not an option or argument of this command: " + extras;
  const std::string text = e.what();
  // "--epochs: At Most 1 required but received 2": an option given twice.
  const std::string at_most = ": At Most 1 required but received ";
  if (const size_t at = text.find(at_most); at != std::string::npos)
    return text.substr(0, at) + " is given " + text.substr(at + at_most.size()) +
           " times: give it once";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // SIGCHLD ignored by whoever started us (a daemon, Python's signal(SIGCHLD, SIG_IGN)) would
  // be inherited through exec: the kernel would reap our children itself, and every loop that
  // waits for a trial, a role or a share would wait for ever.
  std::signal(SIGCHLD, SIG_DFL);
  // While this process has one thread (setenv) and before anything calls BLAS.
  tandem::prepare_nccl_environment();
  const std::string blas_warning = tandem::use_better_blas_kernels();
  if (!blas_warning.empty()) std::fprintf(stderr, "warning: %s\n", blas_warning.c_str());
  CLI::App app{"Tandem: train models with parameter servers, on CPUs and GPUs"};
  // Computed only when asked for: counting CUDA devices starts the driver.
  app.set_version_flag("--version", [] {
    return std::string("tandem ") + TANDEM_VERSION + " (CPU: OpenBLAS " +
           tandem::blas_kernels().loaded + " kernels; CUDA: " + cuda_devices_text() + ")";
  });
  app.require_subcommand(1);
  tandem::cli::add_train_command(app);
  tandem::cli::add_eval_command(app);
  tandem::cli::add_search_command(app);
  tandem::cli::add_trial_slots_command(app);
  tandem::cli::add_predict_command(app);
  tandem::cli::add_prepare_command(app);
  tandem::cli::add_inspect_command(app);
  tandem::cli::add_cluster_commands(app);
  // A mistyped command (`tandem trian`) said "A subcommand is required".
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (argc > 1 && sub->check_name(argv[1]));
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "tandem: error: unknown command '%s' (the commands: %s)\n", argv[1],
                 names.c_str());
    return 1;
  }
  // A bad command line said like every other error, naming the command ("tandem train: error:
  // --lr: ..."): CLI11's own text came bare, without the program or the command.
  app.failure_message([](const CLI::App* parsed, const CLI::Error& e) {
    const std::string command = command_of(*parsed);
    return command + ": error: " + parse_error_text(*parsed, e) +
           (a_fraction_for_a_whole_number(e) ? " (a whole number is expected where --help says INT)"
                                             : "") +
           "\n(`" + command + " --help` lists the options)\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here with 0. A bad command line is an error like any other:
    // status 1, not CLI11's own codes (105 and up).
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", command_of(app).c_str(), e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path that cannot be created or read (permissions, a file where a directory belongs):
    // the user's to fix, not a bug.
    std::fprintf(stderr, "%s: error: %s\n", command_of(app).c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // Not a bug but a size: a model, batch or data set larger than this machine's memory.
    // (Said without the command's name: naming it would allocate, which just failed.)
    std::fprintf(stderr, "tandem: error: out of memory: the model, batch or data asked for more "
                         "memory than this machine could give\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", command_of(app).c_str(), e.what());
    return 2;
  }
  // A result that could not be written (a full disk, a closed pipe: SIGPIPE is ignored by the
  // commands that write while they work) is a failure, not a silent success.
  // (A write that failed earlier, in a flush of a full buffer, leaves the error flag and an
  // errno since overwritten: only this flush's own errno names the cause.)
  const int flush_error = std::fflush(stdout) != 0 ? errno : 0;
  if (flush_error != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "%s: error: cannot write the output: %s\n", command_of(app).c_str(),
                 flush_error != 0 ? std::strerror(flush_error) : "a write failed");
    return 1;
  }
  return 0;
}
