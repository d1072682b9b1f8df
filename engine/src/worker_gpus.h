// Which GPUs of a node each of `tandem launch`'s workers takes. With --gpus-per-worker K on the
// CUDA backend, worker i's group is GPUs [i*K, (i+1)*K) of the node; --worker-gpus "0,1;2,3"
// names them instead, one list per worker. Each worker is then started with `--gpus LIST`
// (RoleOptions::gpus). The logic is pure (the device count is an argument), so it is tested on
// machines without a GPU; visible_cuda_devices() gives the count.
#pragma once

#include <string>
#include <vector>

namespace tandem {

using WorkerGpus = std::vector<std::vector<int>>;  // [worker][member]: a GPU index

// "0,1;2,3" -> {{0,1},{2,3}}: ';' between workers, ',' between one worker's GPUs, spaces ignored.
// "" -> {}. InputError naming the worker and the text for an empty list, anything but a GPU
// number (0, 1, ...), and a GPU listed twice (by one worker, or by two: workers never share one).
WorkerGpus parse_worker_gpus(const std::string& text);

// The GPUs of `workers` workers of `per_worker` members each on a node of `devices` visible CUDA
// devices: worker i gets [i*per_worker, (i+1)*per_worker), or lists[i] when `lists` (from
// parse_worker_gpus) is not empty. InputError when workers * per_worker GPUs are more than
// `devices`, when `lists` has not one list per worker or a list has not per_worker GPUs, or a
// list names a GPU the node does not have. Inputs: workers >= 1, per_worker >= 1.
WorkerGpus assign_worker_gpus(int workers, int per_worker, int devices,
                              const WorkerGpus& lists = {});

std::string gpu_list(const std::vector<int>& gpus);  // {0,1} -> "0,1" (tandem worker --gpus)

int visible_cuda_devices();  // CUDA devices this process sees; 0 in a build without CUDA

}  // namespace tandem
