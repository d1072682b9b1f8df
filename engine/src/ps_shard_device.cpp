#include "ps_shard_device.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "cuda/adam_cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "cuda/device_buffer.h"
#include "tandem/error.h"

namespace tandem {

namespace {

kernels::AdamHyper hyper_of(const OptimizerConfig& o) {
  return {o.learning_rate, o.beta1, o.beta2, o.epsilon};
}

// True once the stream's work is done (or failed: nothing left running), false if it is still
// running after `seconds`.
bool stream_finished_within(cudaStream_t stream, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    if (cudaStreamQuery(stream) != cudaErrorNotReady) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class CudaShardDevice final : public ShardDevice {
 public:
  CudaShardDevice(const OptimizerConfig& optimizer, int device)
      : optimizer_(optimizer), device_(device) {
    TANDEM_CUDA_CHECK(cudaSetDevice(device_));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaShardDevice() override {
    cudaSetDevice(device_);  // the server's thread, or the one that built it: either may differ
    // A step that threw after queueing its copies (a failed launch) may have left them running:
    // they read the pinned buffer and write the device buffers freed here. (Errors ignored: a
    // destructor has nobody to tell, and a failed stream has nothing left running.) Waited for
    // within a bound: a hung GPU never finishes them, and a server whose step threw would never
    // get past its destructor. Past it the buffers are left allocated (the copies may still use
    // them; cudaFree would wait for the device too). (A step's own waits have no bound: a GPU
    // that hangs in one holds the server's thread there.)
    if (stream_ != nullptr && !stream_finished_within(stream_, kDrainSeconds)) {
      std::fprintf(stderr,
                   "tandem: warning: the parameter server's work on GPU %d did not finish "
                   "within %d s (a hung GPU?); its GPU and pinned memory are left allocated\n",
                   device_, kDrainSeconds);
      for (kernels::DeviceBuffer<float>* b : {&params_, &m_, &v_, &grads_}) b->abandon();
      step_.abandon();
      return;
    }
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int device() const override { return device_; }

  void upload(const float* params, const float* moments, int64_t total, int64_t step) override {
    TANDEM_CUDA_CHECK(cudaSetDevice(device_));
    // Empty until every buffer is in place: an upload that fails part way (out of device or
    // pinned memory) must not leave a size that a later step would trust.
    total_ = 0;
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing queued still uses the old ones
    // The old buffers go first: a re-upload (a restore, a second Init) must not hold both sets,
    // on a GPU it may share with a worker.
    params_ = {}, m_ = {}, v_ = {}, grads_ = {}, step_ = {};
    const size_t n = static_cast<size_t>(total);
    params_ = kernels::DeviceBuffer<float>(n);
    m_ = kernels::DeviceBuffer<float>(n);
    v_ = kernels::DeviceBuffer<float>(n);
    grads_ = kernels::DeviceBuffer<float>(n);
    step_ = kernels::DeviceBuffer<kernels::AdamDeviceStep>(1);
    if (pinned_ != nullptr) {
      float* old = pinned_;
      pinned_ = nullptr;  // before the check: a failed free must not be freed again later
      TANDEM_CUDA_CHECK(cudaFreeHost(old));
    }
    // Gradients in and parameters out go through pinned memory: one copy engine transfer each.
    TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_), 2 * n * sizeof(float)));
    const size_t bytes = n * sizeof(float);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(params_.data(), params, bytes, cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(m_.data(), moments, bytes, cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(v_.data(), moments + total, bytes, cudaMemcpyHostToDevice, stream_));
    const kernels::AdamDeviceStep device_step{
        step, step > 0 ? kernels::adam_step_size(hyper_of(optimizer_), step) : 0.0f};
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(step_.data(), &device_step, sizeof(device_step),
                                      cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    total_ = total;
  }

  // The device is set on every call: a server restored from a checkpoint uploads on the thread
  // that built it and steps on its serving thread, whose current device may be another.
  const float* step(const float* gradients, int64_t total) override {
    if (total != total_ || total_ == 0)
      throw std::runtime_error("a step of " + std::to_string(total) + " values on a device that "
                               "holds " + std::to_string(total_) + " (no complete upload)");
    TANDEM_CUDA_CHECK(cudaSetDevice(device_));
    const size_t bytes = static_cast<size_t>(total_) * sizeof(float);
    float* in = pinned_;
    float* out = pinned_ + total_;
    std::memcpy(in, gradients, bytes);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(grads_.data(), in, bytes, cudaMemcpyHostToDevice, stream_));
    if (optimizer_.kind == OptimizerKind::Adam) {
      const kernels::AdamHyper hyper = hyper_of(optimizer_);
      kernels::adam_advance_step_cuda(step_.data(), hyper, stream_);
      kernels::adam_update_cuda(params_.data(), m_.data(), v_.data(), grads_.data(), total_,
                                step_.data(), hyper, stream_);
    } else {
      kernels::sgd_update_cuda(params_.data(), grads_.data(), total_, optimizer_.learning_rate,
                               stream_);
    }
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(out, params_.data(), bytes, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
  }

  void download_moments(float* m_out, float* v_out) override {
    TANDEM_CUDA_CHECK(cudaSetDevice(device_));
    const size_t bytes = static_cast<size_t>(total_) * sizeof(float);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(m_out, m_.data(), bytes, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(v_out, v_.data(), bytes, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  OptimizerConfig optimizer_;
  int device_;
  cudaStream_t stream_ = nullptr;
  int64_t total_ = 0;
  kernels::DeviceBuffer<float> params_, m_, v_, grads_;
  kernels::DeviceBuffer<kernels::AdamDeviceStep> step_;
  float* pinned_ = nullptr;  // 2 x total floats: gradients in, parameters out
  static constexpr int kDrainSeconds = 10;
};

}  // namespace

std::unique_ptr<ShardDevice> make_shard_device(const OptimizerConfig& optimizer, int device) {
  const int devices = kernels::cuda_device_count();
  if (devices == 0)
    throw InputError("GPU shard: no usable CUDA device (no GPU, no driver, or a driver older "
                     "than this build's CUDA runtime)");
  if (device < 0 || device >= devices)
    throw InputError("GPU shard: device " + std::to_string(device) + " asked for, " +
                     std::to_string(devices) + " present");
  return std::make_unique<CudaShardDevice>(optimizer, device);
}

int shard_device_count() { return kernels::cuda_device_count(); }

}  // namespace tandem
