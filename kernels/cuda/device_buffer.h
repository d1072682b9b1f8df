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

  // `count` elements, or an empty buffer when the device has not the memory (the error cleared:
  // an allocation that failed leaves the context usable); CudaError for any other failure.
  static DeviceBuffer if_memory(size_t count) {
    DeviceBuffer buffer;
    if (count == 0) return buffer;
    const cudaError_t status =
        cudaMalloc(reinterpret_cast<void**>(&buffer.data_), count * sizeof(T));
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      buffer.data_ = nullptr;
      return buffer;
    }
    TANDEM_CUDA_CHECK(status);
    buffer.count_ = count;
    return buffer;
  }

  // Forgets the memory without freeing it: for an owner whose stream may still use it and will
  // not finish (a hung GPU), where cudaFree would wait for the device for ever.
  void abandon() noexcept {
    data_ = nullptr;
    count_ = 0;
  }

  // Grows to at least `count` elements (contents are not kept); no-op when already large enough.
  // The old allocation goes first, so growing needs room for the new size only, not for both.
  // (If the new one fails, the buffer is left empty.)
  void reserve(size_t count) {
    if (count <= count_) return;
    release();
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
