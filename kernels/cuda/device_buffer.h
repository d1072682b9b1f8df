// Owning device memory (cudaMalloc) of a fixed number of elements. Moves, never copies; frees
// in the destructor (logging instead of throwing if the free fails).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <utility>

#include "cuda/cuda_check.h"

namespace tandem::kernels {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  // Grows to at least `count` elements (contents are not kept); no-op when already large enough.
  void reserve(size_t count) {
    if (count <= count_) return;
    *this = DeviceBuffer(count);
  }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    const cudaError_t status = cudaFree(data_);
    if (status != cudaSuccess)
      std::fprintf(stderr, "tandem: cudaFree failed: %s\n", cudaGetErrorString(status));
    data_ = nullptr;
    count_ = 0;
  }

  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace tandem::kernels
