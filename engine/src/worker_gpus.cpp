#include "worker_gpus.h"

#include <cctype>
#include <map>

#include "cuda/cuda_device.h"
#include "tandem/error.h"

namespace tandem {

namespace {

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts(1);
  for (const char c : text) {
    if (c == separator) parts.emplace_back();
    else if (!std::isspace(static_cast<unsigned char>(c))) parts.back() += c;
  }
  return parts;
}

}  // namespace

WorkerGpus parse_worker_gpus(const std::string& text) {
  WorkerGpus lists;
  if (split(text, ';') == std::vector<std::string>{""}) return lists;  // empty or blank
  std::map<int, size_t> owner;  // GPU -> the worker that listed it
  for (const std::string& list : split(text, ';')) {
    const size_t worker = lists.size();
    const std::string who = "--worker-gpus \"" + text + "\": worker " + std::to_string(worker);
    if (list.empty()) throw InputError(who + " has no GPUs (one list per worker, e.g. \"0,1;2,3\")");
    lists.emplace_back();
    for (const std::string& item : split(list, ',')) {
      const bool digits = !item.empty() && item.size() <= 6 &&
                          item.find_first_not_of("0123456789") == std::string::npos;
      if (!digits)
        throw InputError(who + "'s \"" + item + "\" is not a GPU number (0, 1, ...)");
      const int gpu = std::stoi(item);
      const auto [it, fresh] = owner.emplace(gpu, worker);
      if (!fresh)
        throw InputError(who + " lists GPU " + std::to_string(gpu) + ", which " +
                         (it->second == worker ? std::string("it lists twice")
                                               : "worker " + std::to_string(it->second) +
                                                     " has already (workers do not share GPUs)"));
      lists.back().push_back(gpu);
    }
  }
  return lists;
}

WorkerGpus assign_worker_gpus(int workers, int per_worker, int devices, const WorkerGpus& lists) {
  if (workers < 1 || per_worker < 1)
    throw InputError("worker GPUs: " + std::to_string(workers) + " workers of " +
                     std::to_string(per_worker) + " GPUs each");
  if (lists.empty()) {
    const long long needed = static_cast<long long>(workers) * per_worker;
    if (needed > devices)
      throw InputError(plural(workers, "worker", "workers") + " of --gpus-per-worker " +
                       std::to_string(per_worker) + " need " + std::to_string(needed) +
                       " GPUs, each worker its own; this node has " +
                       plural(devices, "visible CUDA device", "visible CUDA devices") +
                       " (fewer --workers or --gpus-per-worker, or --worker-gpus to choose)");
    WorkerGpus out(static_cast<size_t>(workers));
    for (int w = 0; w < workers; ++w)
      for (int m = 0; m < per_worker; ++m) out[size_t(w)].push_back(w * per_worker + m);
    return out;
  }
  if (static_cast<int>(lists.size()) != workers)
    throw InputError("--worker-gpus has " + plural(int(lists.size()), "list", "lists") + " for " +
                     plural(workers, "worker", "workers") + ": give one per worker");
  for (size_t w = 0; w < lists.size(); ++w) {
    if (static_cast<int>(lists[w].size()) != per_worker)
      throw InputError("--worker-gpus: worker " + std::to_string(w) + " has " +
                       plural(int(lists[w].size()), "GPU", "GPUs") + ", --gpus-per-worker is " +
                       std::to_string(per_worker) + " (every worker's group is that size)");
    for (const int gpu : lists[w])
      if (gpu >= devices)
        throw InputError("--worker-gpus: worker " + std::to_string(w) + " is given GPU " +
                         std::to_string(gpu) + "; this node has " +
                         plural(devices, "visible CUDA device", "visible CUDA devices") +
                         (devices > 0 ? " (0.." + std::to_string(devices - 1) + ")" : ""));
  }
  return lists;
}

std::string gpu_list(const std::vector<int>& gpus) {
  std::string out;
  for (const int gpu : gpus) out += (out.empty() ? "" : ",") + std::to_string(gpu);
  return out;
}

int visible_cuda_devices() { return kernels::cuda_device_count(); }

}  // namespace tandem
