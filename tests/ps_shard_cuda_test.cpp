// A parameter server whose shard lives on the GPU (ServerOptions::device) against one on the
// CPU: the same initial parameters and pushes give the same parameters and Adam moments (the
// CUDA Adam kernel against its CPU twin, within float rounding of the fused multiply-adds), its
// checkpoints carry the moments from the device, and it resumes from them as the CPU one does.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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

// The values of a float32 tensor of a checkpoint.
std::vector<float> floats_of(const SafeTensorsFile& file, const std::string& name) {
  const SafeTensor* t = file.find(name);
  if (t == nullptr) return {};
  std::vector<float> out(t->data.size() / 4);
  std::memcpy(out.data(), t->data.data(), out.size() * 4);
  return out;
}

// The newest checkpoint in `dir` (the highest step in its name's "-step-N").
SafeTensorsFile newest_checkpoint(const std::string& dir) {
  std::string newest;
  long long newest_step = -1;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    const auto at = name.rfind("-step-");
    if (at == std::string::npos) continue;
    const long long step = std::atoll(name.c_str() + at + 6);
    if (step > newest_step) newest_step = step, newest = f.path().string();
  }
  EXPECT_FALSE(newest.empty()) << "no checkpoint in " << dir;
  return newest.empty() ? SafeTensorsFile{} : read_safetensors(newest);
}

// A GPU server and a CPU server, each checkpointing to its own folder, with the same optimizer.
// `tag` names their endpoints: a new name for each pair in a context (libzmq frees an inproc
// name only after the socket's close has gone through its reaper thread).
struct ServerPair {
  ServerPair(zmq::context_t& ctx, const std::string& dir, const OptimizerConfig& optimizer,
             const std::string& tag) {
    for (ServerOptions* o : {&gpu_options, &cpu_options}) {
      o->context = &ctx;
      o->optimizer = optimizer;
    }
    gpu_options.bind = "inproc://ps-gpu-" + tag;
    cpu_options.bind = "inproc://ps-cpu-" + tag;
    gpu_options.device = 0;
    gpu_options.checkpoint_dir = dir + "/gpu";
    cpu_options.checkpoint_dir = dir + "/cpu";
    gpu_options.shard_name = "gpu";
    cpu_options.shard_name = "cpu";
  }
  ServerOptions gpu_options, cpu_options;
};

// `steps` pushes of the same gradients to both (from step `first`): their replies agree.
void push_both(zmq::context_t& ctx, ParameterServer& gpu, ParameterServer& cpu,
               const std::vector<NamedTensor>& params, bool init, uint32_t first, uint32_t steps) {
  ClientOptions co;
  co.context = &ctx;
  PsClient to_gpu({gpu.endpoint()}, co), to_cpu({cpu.endpoint()}, co);
  if (init) {
    to_gpu.init(params).wait();
    to_cpu.init(params).wait();
  } else {
    to_gpu.init({}).wait();  // learns the layout from the restored servers
    to_cpu.init({}).wait();
  }
  PsResult a, b;
  for (uint32_t step = first; step < first + steps; ++step) {
    const auto g = gradients_for(params, 100 + 7 * step);
    a = to_gpu.push_pull(g).wait();
    b = to_cpu.push_pull(g).wait();
    ASSERT_EQ(a.version, step);
    ASSERT_EQ(b.version, step);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t t = 0; t < a.tensors.size(); ++t)
    EXPECT_TRUE(test::all_close(a.tensors[t].values, b.tensors[t].values, 1e-6, 1e-5))
        << a.tensors[t].name;
}

// Both servers' newest checkpoints: the same step, and parameters and moments that agree (the
// moments come from the device for the GPU server). Under SGD neither has moments.
void expect_checkpoints_agree(const ServerPair& pair, const std::vector<NamedTensor>& params,
                              bool adam, const std::string& step) {
  const SafeTensorsFile g = newest_checkpoint(pair.gpu_options.checkpoint_dir);
  const SafeTensorsFile c = newest_checkpoint(pair.cpu_options.checkpoint_dir);
  EXPECT_EQ(g.metadata.at("step"), step);
  EXPECT_EQ(c.metadata.at("step"), step);
  for (const auto& p : params)
    for (const std::string suffix : {"", ".adam_m", ".adam_v"}) {
      SCOPED_TRACE(p.name + suffix);
      const auto on_gpu = floats_of(g, p.name + suffix), on_cpu = floats_of(c, p.name + suffix);
      if (!adam && !suffix.empty()) {
        EXPECT_TRUE(on_gpu.empty() && on_cpu.empty());
        continue;
      }
      ASSERT_EQ(on_gpu.size(), p.values.size());
      ASSERT_EQ(on_cpu.size(), p.values.size());
      // v is a sum of squares (relative agreement); m and the parameters as the replies.
      EXPECT_TRUE(test::all_close(on_gpu, on_cpu, 1e-6, 1e-5));
    }
}

// The same initial parameters and pushes give a GPU shard and a CPU shard the same parameters,
// and the same Adam moments in their checkpoints; restarted from those checkpoints, both resume
// at the same step and keep agreeing. Under Adam and under SGD.
TEST(PsShardCuda, GpuShardStepsAsTheCpuShardAndResumesFromItsCheckpoints) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::Sgd;
  for (const OptimizerConfig& optimizer : {OptimizerConfig{}, sgd}) {
    const bool adam = optimizer.kind == OptimizerKind::Adam;
    SCOPED_TRACE(adam ? "Adam" : "SGD");
    test::TempDir dir;
    zmq::context_t ctx;
    const auto params = params_of(3);
    const std::string name = adam ? "adam" : "sgd";
    ServerPair pair(ctx, dir.path().string(), optimizer, name);
    {
      ParameterServer gpu(pair.gpu_options), cpu(pair.cpu_options);
      push_both(ctx, gpu, cpu, params, /*init=*/true, 1, 20);
      gpu.stop();  // each writes its final checkpoint, the GPU's moments fetched from the device
      cpu.stop();
    }
    expect_checkpoints_agree(pair, params, adam, "20");
    {
      const ServerPair again(ctx, dir.path().string(), optimizer, name + "-restarted");
      ParameterServer gpu(again.gpu_options), cpu(again.cpu_options);  // restored: step 20
      push_both(ctx, gpu, cpu, params, /*init=*/false, 21, 5);
      gpu.stop();
      cpu.stop();
    }
    expect_checkpoints_agree(pair, params, adam, "25");
  }
}

TEST(PsShardCuda, AMissingDeviceIsRefusedAtStart) {
  ServerOptions o;
  o.device = kernels::cuda_device_count() + 3;
  EXPECT_THROW(ParameterServer{o}, InputError);
}

}  // namespace
}  // namespace tandem
