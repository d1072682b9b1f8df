// The NCCL worker group on device buffers: a group of one GPU (every GPU machine), a group of
// every visible GPU (up to 4) and a missing rank's timeout (2 GPUs or more), and a host buffer
// refused. Values are small whole numbers, so NCCL's summation order cannot change the sums and
// results are compared exactly.
//
// Without a CUDA device every test is skipped; the multi-GPU ones skip on a single GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "cuda/device_buffer.h"
#include "group_collective.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// An odd count (400 KB of floats): several of NCCL's pipeline chunks, and a ragged last one.
constexpr size_t kCount = 100003;

// Rank r's values: (r + 1) * (i % 7) - 3, whole numbers, never all zero.
std::vector<float> rank_values(int rank) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7) - 3);
  return v;
}

void upload(kernels::DeviceBuffer<float>& buffer, const std::vector<float>& values) {
  TANDEM_CUDA_CHECK(cudaMemcpy(buffer.data(), values.data(), values.size() * sizeof(float),
                               cudaMemcpyHostToDevice));
}

std::vector<float> download(const kernels::DeviceBuffer<float>& buffer) {
  std::vector<float> values(buffer.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(values.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost));
  return values;
}

TEST(NcclCollective, OneGpuGroupAllReducesAndBroadcastsDeviceBuffers) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto group = make_nccl_collective({0}, 10000);
  ASSERT_EQ(group->size(), 1);
  ASSERT_EQ(group->memory(), GroupCollective::Memory::Device);
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
  kernels::DeviceBuffer<float> buffer(kCount);
  const std::vector<float> values = rank_values(0);
  upload(buffer, values);
  group->all_reduce_sum(0, buffer.data(), kCount);  // the sum of one member is itself
  EXPECT_EQ(download(buffer), values);
  group->broadcast(0, buffer.data(), kCount, 0);
  EXPECT_EQ(download(buffer), values);
  group->all_reduce_sum(0, buffer.data(), 0);  // nothing to do, still a collective
}

TEST(NcclCollective, AHostBufferIsRefusedNamingTheRank) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto group = make_nccl_collective({0}, 10000);
  std::vector<float> host(16, 1.0f);
  try {
    group->all_reduce_sum(0, host.data(), host.size());
    ADD_FAILURE() << "a host buffer was taken";
  } catch (const GroupError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 (GPU 0) passed a buffer that is not memory of GPU 0"),
              std::string::npos)
        << e.what();
  }
}

TEST(NcclCollective, EveryVisibleGpuSumsAndBroadcasts) {
  const int gpus = std::min(kernels::cuda_device_count(), 4);
  if (gpus < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << gpus;
  std::vector<int> devices;
  for (int d = 0; d < gpus; ++d) devices.push_back(d);
  auto group = make_nccl_collective(devices, 30000);
  std::vector<float> sum(kCount, 0.0f);
  for (int r = 0; r < gpus; ++r) {
    const std::vector<float> v = rank_values(r);
    for (size_t i = 0; i < kCount; ++i) sum[i] += v[i];
  }
  std::vector<std::vector<float>> reduced(static_cast<size_t>(gpus)), broadcast(static_cast<size_t>(gpus));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(gpus));
  std::vector<std::thread> threads;
  for (int r = 0; r < gpus; ++r)
    threads.emplace_back([&, r] {
      try {
        const size_t i = static_cast<size_t>(r);
        TANDEM_CUDA_CHECK(cudaSetDevice(devices[i]));
        kernels::DeviceBuffer<float> buffer(kCount);
        upload(buffer, rank_values(r));
        group->all_reduce_sum(r, buffer.data(), kCount);
        reduced[i] = download(buffer);
        upload(buffer, rank_values(r));
        group->broadcast(r, buffer.data(), kCount, 1);
        broadcast[i] = download(buffer);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < gpus; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (errors[i]) {
      try {
        std::rethrow_exception(errors[i]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
      continue;
    }
    EXPECT_EQ(reduced[i], sum) << "rank " << r;
    EXPECT_EQ(broadcast[i], rank_values(1)) << "rank " << r;
  }
}

TEST(NcclCollective, ARankThatNeverCallsIsNamedAfterTheTimeout) {
  if (kernels::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  auto group = make_nccl_collective({0, 1}, 500);
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
  kernels::DeviceBuffer<float> buffer(kCount);
  upload(buffer, rank_values(0));
  try {
    group->all_reduce_sum(0, buffer.data(), kCount);  // rank 1 never comes
    ADD_FAILURE() << "an all-reduce without rank 1 completed";
  } catch (const GroupError& e) {
    EXPECT_EQ(std::string(e.what()), "worker group: rank 1 did not reach all_reduce #1 within 500 ms");
  }
  EXPECT_THROW(group->broadcast(1, buffer.data(), kCount, 0), GroupError);  // broken from now on
}

}  // namespace
}  // namespace tandem
