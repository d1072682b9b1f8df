// A parameter server whose shard lives on the GPU (ServerOptions::device) against one on the
// CPU: the same initial parameters and pushes give the same parameters and Adam moments (the
// CUDA Adam kernel against its CPU twin, within float rounding of the fused multiply-adds), and
// its checkpoints carry the moments from the device. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <filesystem>

#include "cuda/cuda_device.h"
#include "ps_client.h"
#include "ps_server.h"
#include "safetensors.h"
#include "test_support.h"

namespace tandem {
namespace {

std::vector<NamedTensor> params_of(uint32_t seed) {
  // Big enough to take several blocks of the kernel, and a size that is no multiple of 4.
  return {{"w", {301, 67}, test::random_floats(301 * 67, seed)},
          {"b", {67}, test::random_floats(67, seed + 1)}};
}

std::vector<NamedTensor> gradients_for(const std::vector<NamedTensor>& params, uint32_t seed) {
  std::vector<NamedTensor> g;
  for (const auto& p : params)
    g.push_back({p.name, p.shape, test::random_floats(p.values.size(), seed++, -0.5f, 0.5f)});
  return g;
}

TEST(PsShardCuda, GpuShardStepsAsTheCpuShardAndCheckpointsItsMoments) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  zmq::context_t ctx;
  ServerOptions gpu_options, cpu_options;
  gpu_options.context = cpu_options.context = &ctx;
  gpu_options.bind = "inproc://ps-gpu";
  cpu_options.bind = "inproc://ps-cpu";
  gpu_options.device = 0;
  gpu_options.checkpoint_dir = dir.file("gpu");
  gpu_options.shard_name = "gpu";
  ParameterServer gpu(gpu_options), cpu(cpu_options);
  ClientOptions co;
  co.context = &ctx;
  PsClient to_gpu({gpu.endpoint()}, co), to_cpu({cpu.endpoint()}, co);
  const auto params = params_of(3);
  to_gpu.init(params).wait();
  to_cpu.init(params).wait();
  PsResult a, b;
  for (uint32_t step = 1; step <= 20; ++step) {
    const auto g = gradients_for(params, 100 + 7 * step);
    a = to_gpu.push_pull(g).wait();
    b = to_cpu.push_pull(g).wait();
    ASSERT_EQ(a.version, step);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t t = 0; t < a.tensors.size(); ++t)
    EXPECT_TRUE(test::all_close(a.tensors[t].values, b.tensors[t].values, 1e-6, 1e-5)) << a.tensors[t].name;
  gpu.stop();  // writes the final checkpoint, moments fetched from the device
  std::string path;
  for (const auto& f : std::filesystem::directory_iterator(gpu_options.checkpoint_dir)) path = f.path();
  ASSERT_FALSE(path.empty());
  const SafeTensorsFile file = read_safetensors(path);
  const SafeTensor* m = file.find("w.adam_m");
  ASSERT_NE(m, nullptr);
  double sum = 0;
  for (size_t k = 0; k < m->data.size() / 4; ++k) {
    float x;
    std::memcpy(&x, m->data.data() + 4 * k, 4);
    sum += std::fabs(x);
  }
  EXPECT_GT(sum, 0.0) << "the moments were not fetched from the device";
}

TEST(PsShardCuda, AMissingDeviceIsRefusedAtStart) {
  ServerOptions o;
  o.device = kernels::cuda_device_count() + 3;
  EXPECT_THROW(ParameterServer{o}, InputError);
}

}  // namespace
}  // namespace tandem
