// One parameter server's share of the parameters and their Adam state: the numbers, without
// sockets. The parameters live in one 64-byte aligned block and Adam's moments in another
// (m | v), each tensor at a 16-float boundary as in ParameterLayout, so one optimizer sweep
// covers the shard; with use_device() the numbers are kept and stepped on a GPU instead.
// Replies are sent zero-copy from the parameter block (params_hold()), so a step never writes
// into a block ZeroMQ still reads: it steps in place when no reply holds the block (the usual
// case: a reply is on the wire long before the next push arrives), and otherwise first copies
// the parameters into a free block from a pool (copy on write).
// Row-split parts of large tensors (ps_placement.h) arrive and are held as ordinary tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "aligned_buffer.h"
#include "cpu/adam_cpu.h"
#include "send_hold.h"
#include "ps_shard_device.h"
#include "tandem/config.h"
#include "wire_protocol.h"

namespace tandem {

// The shard's GPU failed (a CUDA error in an upload, a step or a download): what is on the device
// is then unknown, so the shard refuses every later use of it, and the server every request
// that reads or changes the parameters (transport::kShardFailed).
class ShardDeviceFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class PsShard {
 public:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0;  // floats from the start of the parameter block (and of m, of v)
    int64_t size = 0;
  };

  explicit PsShard(OptimizerConfig optimizer) : optimizer_(optimizer) {}

  bool initialized() const { return initialized_; }
  int64_t step() const { return step_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const float* values(const Entry& e) const { return params_->value.data() + e.offset; }
  // What a zero-copy send of values() must hold (transport::send_message's `hold`): the block
  // stays unchanged while a frame sent from it is ZeroMQ's. Null before initialisation.
  std::shared_ptr<transport::SendHold> params_hold() const { return params_; }
  // Adam's moments of an entry (zero under SGD).
  const float* adam_m(const Entry& e) const { return moments_.data() + e.offset; }
  const float* adam_v(const Entry& e) const { return moments_.data() + total_ + e.offset; }

  // One tensor restored from a checkpoint: parameters and moments (m, v empty: zero).
  struct Restored {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values, m, v;
  };
  // Takes restored tensors (already checked: sizes match shapes) as the state, at `step`.
  void restore(const std::vector<Restored>& tensors, int64_t step);

  // Checks tensors meant to become the initial parameters: at least one, float32, finite.
  // Returns "" when fine, else what is wrong (naming the tensor).
  std::string check_initial(const transport::Message& m,
                            const std::vector<transport::ByteSpan>& data) const;
  // Takes the (checked) tensors as the parameters; Adam's moments start at zero, step at 0.
  void initialize(const transport::Message& m, const std::vector<transport::ByteSpan>& data);

  // Checks one push and stages its gradients: exactly this shard's tensors (every one: a push
  // must carry a gradient for every parameter the server holds, so no gradient is silently taken
  // as zero), exact shapes, float32, finite. Returns "" when fine, else the problem; `kind` gets
  // the Error reply's kind, also logged once per kind (transport::kUnknownName, kWrongShape,
  // kNonFinite, ...). A push that fails leaves the state untouched.
  // Staging copies nothing when it can help it: on the CPU the optimizer later reads each
  // gradient from its received frame, so `data` must stay alive and unchanged until
  // apply_staged() or accumulate_staged() (the server calls both within one request). A frame
  // that is not float-aligned, and every gradient for a device (one upload), is gathered into
  // an aligned buffer instead.
  std::string stage_gradients(const transport::Message& m,
                              const std::vector<transport::ByteSpan>& data, std::string& kind);
  // One optimizer step with the staged gradients: step += 1, then Adam (TensorFlow's form, the
  // trainer's kernel) or SGD, tensor by tensor. Each element's update is the same arithmetic
  // whether the sweep covers one tensor or the whole block, so the bits are the trainer's.
  void apply_staged();

  // Sync mode (SyncReplicasOptimizer): add the staged gradients into the step's running sum...
  void accumulate_staged();
  int64_t pending() const { return pending_; }  // gradients summed since the last step
  // ...then one step on sum / pending() (the mean of what arrived, as TensorFlow's
  // ConditionalAccumulator averages; pending() == replicas_to_aggregate unless the server's step
  // timeout fired first, or a worker said it was idle: out of batches at the end of the data).
  // The sum starts at zero, so the mean of g1..gN is exactly (((0 + g1) + g2) + ... + gN) /
  // float(N), element by element. Needs pending() > 0.
  // Each gradient was checked finite, but their sum can still overflow float32: then the step is
  // dropped (false; parameters, moments and step stay as they were) rather than taken on an
  // infinite mean, which would make parameters inf or NaN for good. The sum is cleared either way.
  bool apply_accumulated();

  // Keeps the parameters and Adam's moments on a GPU (ps_shard_device.h) from now on: every step
  // runs there; the host keeps a copy of the parameters (replies are sent from it).
  void use_device(std::unique_ptr<ShardDevice> device);
  int device() const { return device_ ? device_->device() : -1; }
  // Why the shard's GPU failed ("" while it has not): see ShardDeviceFailed.
  const std::string& device_failure() const { return device_failure_; }
  // With a device, Adam's moments are on it: call before reading adam_m()/adam_v().
  void fetch_moments();

  // Entries for the names in `names` (all when empty); "" or the unknown name's error.
  std::string select(const std::vector<std::string>& names, std::vector<const Entry*>& out) const;

 private:
  using ParamBlock = transport::Held<AlignedBuffer<float>>;

  const Entry* find(const std::string& name) const;
  // Lays out `entries_` for tensors of these shapes, allocates fresh blocks (zeroed), step 0.
  void lay_out(const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors);
  // The parameter block, safe to write: the current one when no send holds it, else a copy of it
  // in a free block (copying the values only when `keep_values`), which becomes the current one.
  float* writable_params(bool keep_values);
  void step_with_gradients();  // step += 1, one optimizer sweep with gradients_
  void upload_to_device();     // the parameters, moments and step, when there is a device
  // Runs a call on the device; a failure is kept (device_failure_) and thrown as
  // ShardDeviceFailed, as is every later call.
  void on_device(const char* what, const std::function<void()>& call);
  kernels::AdamHyper adam_hyper() const;
  // This step's rate: Adam's bias-corrected step size at step_, or SGD's learning rate.
  float step_size() const;
  // One optimizer sweep over `n` floats from `offset` (of the blocks) with gradients `g`.
  void update(float* w, int64_t offset, int64_t n, const float* g, float rate);

  struct Staged {
    const Entry* entry;
    const float* gradient;  // the received frame, or its copy in gradients_
  };

  OptimizerConfig optimizer_;
  bool initialized_ = false;
  std::string device_failure_;
  int64_t step_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0;                // floats per block (per moment), padding included
  transport::HeldPool<AlignedBuffer<float>> param_blocks_;
  std::shared_ptr<ParamBlock> params_;  // the current parameters, one of param_blocks_
  AlignedBuffer<float> moments_;        // Adam's m, then v
  std::vector<Staged> staged_;       // the staged push, tensor by tensor (meaningful only
                                     // after stage_gradients returned "")
  AlignedBuffer<float> gradients_;   // gathered gradients (aligned, zero padding), when needed
  AlignedBuffer<float> sum_;         // sync mode: the step's gradients summed (zero padding)
  int64_t pending_ = 0;
  std::unique_ptr<ShardDevice> device_;
};

}  // namespace tandem
