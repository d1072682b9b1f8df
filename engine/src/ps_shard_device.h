// A parameter server's optimizer on a GPU: the shard's parameters and Adam's moments live in
// device memory and each step is the fused Adam kernel (kernels/cuda/adam_cuda.h, one launch
// over the whole shard, the step size computed on the device). The host keeps a copy of the
// parameters, refreshed after every step, because replies are sent from host memory; the moments
// stay on the device and are copied back only when a checkpoint asks (download_moments).
// Built without CUDA, make_shard_device throws InputError.
#pragma once

#include <cstdint>
#include <memory>

#include "tandem/config.h"

namespace tandem {

class ShardDevice {
 public:
  virtual ~ShardDevice() = default;
  virtual int device() const = 0;
  // The parameters (`total` floats, padding included), Adam's moments (m | v, `total` floats
  // each) and the step so far.
  virtual void upload(const float* params, const float* moments, int64_t total, int64_t step) = 0;
  // One step with `gradients` (`total` floats, as uploaded: anything else throws): step += 1,
  // Adam (or SGD) on the device, then the parameters are copied back to host memory; returns
  // them (total floats, valid until the next call).
  virtual const float* step(const float* gradients, int64_t total) = 0;
  virtual void download_moments(float* m_out, float* v_out) = 0;
};

// On CUDA device `device`; InputError when this build has no CUDA or the device cannot be used.
std::unique_ptr<ShardDevice> make_shard_device(const OptimizerConfig& optimizer, int device);
// The number of CUDA devices this process can use (0 without CUDA or without a device).
int shard_device_count();

}  // namespace tandem
