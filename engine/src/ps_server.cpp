#include "ps_server.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "file_io.h"
#include "ps_checkpoint_choice.h"
#include "ps_checkpoint_file.h"
#include "safetensors.h"
#include "tandem/error.h"

namespace tandem {

using transport::ByteSpan;
using transport::DecodeResult;
using transport::Frames;
using transport::Message;
using transport::MessageType;
using Clock = std::chrono::steady_clock;

const char* to_string(PsMode mode) {
  switch (mode) {
    case PsMode::Async: return "async";
    case PsMode::Sync: return "sync";
    case PsMode::BoundedStaleness: return "bounded_staleness";
  }
  return "unknown";
}

namespace {

std::vector<std::string> split_names(const std::string& extra) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start < extra.size()) {
    size_t end = extra.find('\n', start);
    if (end == std::string::npos) end = extra.size();
    if (end > start) names.push_back(extra.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

ParameterServer::ParameterServer(ServerOptions options)
    : options_(std::move(options)), shard_(options_.optimizer),
      clocks_(options_.worker_timeout_ms, options_.longest_wait_ms) {
  const std::string where = "parameter server at " + options_.bind;
  if (options_.replicas_to_aggregate < 1)
    throw InputError(where + ": replicas_to_aggregate must be at least 1");
  if (options_.longest_wait_ms < 1)
    throw InputError(where + ": longest_wait_ms must be at least 1 (got " +
                     std::to_string(options_.longest_wait_ms) + ")");
  if (options_.staleness_bound < 0) throw InputError(where + ": staleness_bound must be >= 0");
  stats_.mode = to_string(options_.mode);
  const bool curve = !options_.curve_secret_key.empty();
  if (curve) {
    if (options_.bind.rfind("inproc://", 0) == 0)
      throw InputError(where + ": CURVE does not apply to inproc:// endpoints (libzmq secures "
                               "only tcp:// and ipc://); bind to one of those");
    transport::validate_curve_key(options_.curve_secret_key, where + ": curve_secret_key");
    for (size_t i = 0; i < options_.curve_allowed_clients.size(); ++i)
      transport::validate_curve_key(options_.curve_allowed_clients[i],
                                    where + ": curve_allowed_clients[" + std::to_string(i) + "]");
    curve_public_key_ = transport::curve_public_from_secret(options_.curve_secret_key);
  } else if (!options_.curve_allowed_clients.empty()) {
    throw InputError(where + ": curve_allowed_clients without curve_secret_key");
  }
  try {
    if (options_.context == nullptr) {
      own_context_ = std::make_unique<zmq::context_t>(1);
      options_.context = own_context_.get();
    }
    if (curve) {
      // One ZAP domain per server (its address is unique while it lives), so servers sharing a
      // context each enforce their own allowed list.
      char domain[64];
      std::snprintf(domain, sizeof domain, "tandem-ps-%p", static_cast<void*>(this));
      zap_ = transport::ZapAuthenticator::allow(*options_.context, domain,
                                                options_.curve_allowed_clients);
    }
    socket_ = zmq::socket_t(*options_.context, zmq::socket_type::router);
    if (curve) {  // before bind: a connection accepted earlier would not be CURVE
      socket_.set(zmq::sockopt::curve_server, 1);
      socket_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
      socket_.set(zmq::sockopt::zap_domain, zap_.domain());
    }
    // A short linger: a Shutdown reply still leaves, but closing never waits long on dead peers.
    socket_.set(zmq::sockopt::linger, 200);
    // ZeroMQ drops a peer whose frame exceeds this before it reaches us (oversized messages).
    socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_message_bytes));
  } catch (const zmq::error_t& e) {
    throw transport::TransportError(where + ": cannot set up its socket: " + e.what());
  }
  if (options_.device >= 0)
    shard_.use_device((options_.make_device ? options_.make_device : make_shard_device)(
        options_.optimizer, options_.device));
  if (!options_.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.checkpoint_dir, ec);
    if (ec)
      throw IoError(where + ": cannot create checkpoint_dir '" + options_.checkpoint_dir +
                    "': " + ec.message());
    restore_newest();
    writer_ = std::make_unique<CheckpointWriter>(
        options_.shard_name,
        [this](const std::string&, int64_t step) { prune_checkpoints(step); });
  }
  // Bound last: a server refused above (checkpoints it cannot resume from, a GPU that fails)
  // leaves its address free. Closed as the constructor throws, a bound socket let the address go
  // only once ZeroMQ's reaper had closed it, and an inproc:// name was still taken for the
  // server started next (after the checkpoints were moved away, say).
  endpoint_ = transport::bind_checked(socket_, options_.bind, where + ": cannot bind");
  bound_file_ = transport::BoundIpcFile(options_.bind);
  thread_ = std::thread([this] { serve(); });
}


std::string ParameterServer::init_mismatch(const Message& m) const {
  using Part = std::pair<std::string, std::vector<int64_t>>;
  std::vector<Part> held, offered;
  for (const auto& e : shard_.entries()) held.push_back({e.name, e.shape});
  for (const auto& t : m.tensors) offered.push_back({t.name, t.shape});
  std::sort(held.begin(), held.end());
  std::sort(offered.begin(), offered.end());
  if (held == offered && (model_order_.empty() || model_order_ == m.extra)) return "";
  auto text = [](const std::vector<Part>& parts) {
    std::string out;
    for (const auto& [name, shape] : parts) {
      out += (out.empty() ? "" : ", ") + name + " [";
      for (size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
      out += "]";
    }
    return out;
  };
  return "this server holds " + text(held) +
         (restored_from_.empty() ? std::string(" (initialised earlier)")
                                 : " (restored from checkpoint " + restored_from_ + ")") +
         ", but the chief's Init is for " + text(offered) +
         (held == offered ? " of another model (its parameter list differs)" : "") +
         ": another model or another number of servers; resume with the settings the "
         "checkpoints were written with, or start from an empty checkpoint directory";
}

void ParameterServer::restore_newest() {
  const bool adam = options_.optimizer.kind == OptimizerKind::Adam;
  // A checkpoint write killed before its rename left a whole shard's size, which no pruning sees.
  remove_unfinished_writes(options_.checkpoint_dir, options_.shard_name + "-step-",
                           "tandem parameter server " + options_.shard_name);
  const CheckpointChoice choice = choose_shard_checkpoint(
      options_.checkpoint_dir, options_.shard_name, adam,
      [&](ShardCheckpoint&& checkpoint, const std::string& path) {
        shard_.restore(checkpoint.tensors, checkpoint.step);
        model_order_ = checkpoint.model_order;
        checkpointed_step_ = checkpoint.step;
        restored_epochs_whole_ = checkpointed_epochs_whole_ = checkpoint.epochs_whole;
        restored_from_ = path;
        stats_.version = checkpoint.step;
      });
  for (const auto& [path, why] : choice.skipped) {
    std::fprintf(stderr, "tandem parameter server %s: skipping checkpoint %s: %s\n",
                 options_.shard_name.c_str(), path.c_str(), why.c_str());
    unrestorable_.insert(path);
  }
  const std::string refusal = choice.refusal(options_.shard_name, options_.checkpoint_dir);
  if (!refusal.empty()) throw InputError(refusal);
  if (!choice.path.empty())
    std::fprintf(stderr, "tandem parameter server %s: resumed from checkpoint %s (step %lld)\n",
                 options_.shard_name.c_str(), choice.path.c_str(),
                 static_cast<long long>(choice.step));
}

uint64_t ParameterServer::submit_checkpoint() {
  const bool adam = options_.optimizer.kind == OptimizerKind::Adam;
  // Read before the snapshot: the epochs it names were whole before it was taken.
  const int64_t epochs_whole = epochs_whole_now();
  shard_.fetch_moments();
  SafeTensorsFile file = encode_shard_checkpoint(
      shard_, adam,
      {to_string(options_.mode), options_.shard_name, to_string(options_.optimizer.kind),
       model_order_, epochs_whole});
  const std::string path =
      (std::filesystem::path(options_.checkpoint_dir) /
       (options_.shard_name + "-step-" + std::to_string(shard_.step()) + ".safetensors"))
          .string();
  const uint64_t ticket = writer_->submit(path, shard_.step(), std::move(file));
  checkpointed_step_ = shard_.step();
  checkpointed_epochs_whole_ = epochs_whole;
  checkpointed_at_ = Clock::now();
  return ticket;
}

int64_t ParameterServer::epochs_whole_now() const {
  return options_.epochs_whole ? std::max(restored_epochs_whole_, options_.epochs_whole()) : -1;
}

void ParameterServer::answer_checkpoint_requests() {
  if (checkpoint_requests_.empty()) return;
  // Taken out of the list before any is answered: each is answered once, whatever a send does.
  std::vector<std::pair<Pending, CheckpointWriter::Outcome>> ready;
  std::vector<Pending> still;
  for (Pending& p : checkpoint_requests_) {
    std::optional<CheckpointWriter::Outcome> outcome = writer_->outcome_since(p.ticket);
    if (outcome) ready.emplace_back(std::move(p), std::move(*outcome));
    else still.push_back(std::move(p));
  }
  checkpoint_requests_.swap(still);
  for (const auto& [p, outcome] : ready) {
    try {  // one failed send (a peer gone) must not leave the others unanswered
      if (!outcome.error.empty())
        reply_error(p.peer, MessageType::Checkpoint, p.request_id,
                    "checkpoint failed: " + outcome.error, transport::kCheckpointFailed);
      else
        reply_extra(p.peer, p.request_id, outcome.path);
    } catch (const std::exception& e) {
      log_failure(e);
    }
  }
}

void ParameterServer::prune_checkpoints(int64_t written) const {
  // Only files at or below the step written count: one with a higher step is not ours (a
  // corrupt leftover skipped at start, say) and deleting by number would drop the newest write.
  size_t kept = 0;
  for (const auto& [step, path] :
       list_shard_checkpoints(options_.checkpoint_dir, options_.shard_name)) {
    // Nor does one that could not be restored: counted among the two kept, it would have the
    // older restorable one deleted.
    if (step > written || unrestorable_.count(path) != 0) continue;
    if (++kept <= 2) continue;
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}

void ParameterServer::maybe_checkpoint(bool final_one) {
  if (options_.checkpoint_dir.empty() || !shard_.initialized()) return;
  if (!shard_.device_failure().empty()) return;  // the moments on the GPU are unknown
  const int64_t step = shard_.step();
  // Nothing changed since the last one; at the end, not even the epochs it holds whole (a run's
  // last epoch was counted after a checkpoint of its last step was taken).
  if (step == checkpointed_step_ &&
      !(final_one && epochs_whole_now() > checkpointed_epochs_whole_))
    return;
  bool due = final_one;
  const int64_t n = options_.checkpoint_every_steps;
  if (n > 0 && (checkpointed_step_ < 0 ? step >= n : step / n > checkpointed_step_ / n))
    due = true;
  if (options_.checkpoint_every_seconds > 0 &&
      std::chrono::duration<double>(Clock::now() - checkpointed_at_).count() >=
          options_.checkpoint_every_seconds)
    due = true;
  if (!due) return;
  submit_checkpoint();  // the writer logs a failed write
}

ParameterServer::~ParameterServer() { stop(); }

void ParameterServer::stop() {
  std::lock_guard<std::mutex> lock(stop_mutex_);
  stopping_ = true;
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

ServerStats ParameterServer::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ServerStats s = stats_;
  s.curve_rejected = zap_.rejected();
  s.seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  if (s.seconds > 0) {
    s.pushes_per_s = double(s.pushes + s.stale_dropped) / s.seconds;
    s.pulls_per_s = double(s.pulls) / s.seconds;
  }
  return s;
}

void ParameterServer::count(int64_t ServerStats::*field) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++(stats_.*field);
}

void ParameterServer::log_once(const std::string& kind, const std::string& text) {
  if (!logged_.insert(kind).second) return;
  std::fprintf(stderr, "tandem parameter server %s: bad input (%s): %s (logged once per kind)\n",
               endpoint_.c_str(), kind.c_str(), text.c_str());
}

void ParameterServer::log_failure(const std::exception& e) {
  // Logged once per kind of failure: the text may name a request id or a peer, which would make
  // every occurrence a kind of its own, logged and remembered each time.
  std::string kind = std::string("internal: ") + e.what();
  kind.erase(std::remove_if(kind.begin(), kind.end(), [](char c) { return c >= '0' && c <= '9'; }),
             kind.end());
  log_once(kind, e.what());
}

void ParameterServer::serve() {
  Frames frames;
  while (!stopping_) {
    try {
      // Deferred and held replies have deadlines: wait no longer than a poll interval.
      if (transport::receive_frames(socket_, frames, options_.poll_ms, endpoint_)) handle(frames);
      on_tick();
    } catch (const std::exception& e) {
      // A failed send to one peer (or a bad_alloc on one message) must not stop the server.
      log_failure(e);
    }
  }
  // Written before stop() returns. When the newest write failed (a periodic one, with nothing
  // changed since, or this one), try once more: this is the last chance. A failure here (no
  // memory for the snapshot, a GPU shard's moments that cannot be read back) is said and the
  // thread still ends: thrown from it, it would end the process.
  try {
    maybe_checkpoint(true);  // the final one, if anything changed since the last
    if (writer_ && !writer_->wait_idle().empty() && shard_.initialized() &&
        shard_.device_failure().empty()) {
      submit_checkpoint();
      writer_->wait_idle();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem parameter server %s: the final checkpoint failed: %s\n",
                 endpoint_.c_str(), e.what());
  }
  if (writer_) {
    writer_->wait_idle();
    answer_checkpoint_requests();  // every write has ended
  }
  socket_.close();  // the socket belongs to this thread; nothing uses it after this
  bound_file_.remove();  // (the destructor would too, later: a stopped server's path goes now)
}

void ParameterServer::reply_error(const zmq::message_t& peer, MessageType type,
                                  uint64_t request_id, const std::string& text,
                                  const std::string& kind) {
  count(&ServerStats::rejected);
  // Workers asking before the chief has initialised is the normal start of a cluster, not bad
  // input: answered (they retry), counted, not logged. A failed GPU is not bad input either:
  // handle() logs it.
  // Type Error stands for "a request whose type could not be read" (see handle_malformed).
  const std::string what =
      type == MessageType::Error ? "unreadable request" : transport::to_string(type);
  if (kind != transport::kNotInitialised && kind != transport::kShardFailed)
    log_once(what + ": " + kind, text);
  const auto out = transport::encode_message(
      transport::make_message(MessageType::Error, request_id, uint64_t(shard_.step()), {},
                              transport::encode_error_reason(kind, text)),
      {});
  transport::send_message(socket_, out, &peer, endpoint_);
}

void ParameterServer::reply_extra(const zmq::message_t& peer, uint64_t request_id,
                                  std::string extra) {
  const auto out = transport::encode_message(
      transport::make_message(MessageType::Reply, request_id, uint64_t(shard_.step()), {},
                              std::move(extra)),
      {});
  transport::send_message(socket_, out, &peer, endpoint_);
}

void ParameterServer::reply_tensors(const zmq::message_t& peer, uint64_t request_id,
                                    const std::vector<const PsShard::Entry*>& entries,
                                    std::string extra) {
  std::vector<transport::FloatTensorRef> refs;
  refs.reserve(entries.size());
  for (const auto* e : entries) refs.push_back({e->name, e->shape, shard_.values(*e)});
  // Zero-copy: the frames point into the shard's parameter block, which the next step leaves
  // alone while ZeroMQ holds them (the shard copies on write).
  const auto out = transport::encode_float_message(MessageType::Reply, request_id,
                                                   uint64_t(shard_.step()), refs, std::move(extra));
  transport::send_message(socket_, out, &peer, endpoint_, shard_.params_hold());
}

void ParameterServer::handle_malformed(const Frames& frames, const DecodeResult& r) {
  const std::string kind = transport::kMalformed + std::string(transport::to_string(r.code));
  // An Error reply needs the request id: readable when frame 0 starts with the magic and is
  // long enough, even if the version or type is wrong (so the sender learns why).
  const bool addressable = frames.size() >= 2 && frames[1].size() >= 16 &&
                           read_u32(frames[1].data<uint8_t>()) == transport::kMagic;
  const bool one_way = r.header_ok && (r.message.header.type == MessageType::Push ||
                                       r.message.header.type == MessageType::Idle);
  if (!addressable || one_way) {
    count(&ServerStats::dropped);
    log_once(kind, r.error + " (dropped)");
    return;
  }
  uint64_t request_id;
  std::memcpy(&request_id, frames[1].data<uint8_t>() + 8, 8);
  reply_error(frames[0], r.header_ok ? r.message.header.type : MessageType::Error, request_id,
              std::string("malformed message (") + transport::to_string(r.code) + "): " + r.error,
              kind);
}

void ParameterServer::handle(Frames& frames) {
  if (frames.size() < 2) {  // a routing id and nothing else: an empty message
    count(&ServerStats::dropped);
    log_once(transport::kMalformed + std::string("empty"), "a message with no frames");
    return;
  }
  const DecodeResult r = transport::decode_frames(frames, 1, options_.limits);
  if (r.header_ok) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.by_type[transport::to_string(r.message.header.type)];
  }
  if (!r.ok()) return handle_malformed(frames, r);

  const zmq::message_t& peer = frames[0];
  const MessageType type = r.message.header.type;
  if (options_.mode == PsMode::BoundedStaleness)
    clocks_.heard(std::string(peer.data<char>(), peer.size()), Clock::now());
  else if (options_.mode == PsMode::Sync && type == MessageType::Pull)
    clocks_.resumed(std::string(peer.data<char>(), peer.size()), Clock::now());
  try {
    dispatch(peer, r);
  } catch (const ShardDeviceFailed& e) {
    // The request that met the failure, those waiting, and every one after it that needs the
    // parameters (dispatch refuses them) get an error naming it; the server goes on answering
    // stats and shutdown. Its newest checkpoint was written before the failure (none after).
    fail_waiting_requests();
    if (type == MessageType::Push || type == MessageType::Idle) {  // one-way: no reply
      count(&ServerStats::dropped);
      return;
    }
    reply_error(peer, type, r.message.header.request_id, shard_failure_text(),
                transport::kShardFailed);
  }
}

std::string ParameterServer::shard_failure_text() const {
  return shard_.device_failure() + "; restart this server: it resumes from its newest checkpoint";
}

void ParameterServer::fail_waiting_requests() {
  if (logged_.insert(transport::kShardFailed).second)
    std::fprintf(stderr, "tandem parameter server %s: %s; it answers no request for the "
                 "parameters from now on\n", endpoint_.c_str(), shard_failure_text().c_str());
  std::vector<Pending> waiting;
  waiting.swap(held_);
  for (auto& p : deferred_) waiting.push_back(std::move(p));
  deferred_.clear();
  for (const Pending& p : waiting) {
    try {  // one failed send (a peer gone) must not leave the others unanswered
      reply_error(p.peer, MessageType::PushPull, p.request_id, shard_failure_text(),
                  transport::kShardFailed);
    } catch (const std::exception& e) {
      log_failure(e);
    }
  }
}

void ParameterServer::dispatch(const zmq::message_t& peer, const DecodeResult& r) {
  const Message& m = r.message;
  const MessageType type = m.header.type;
  const uint64_t id = m.header.request_id;
  const bool needs_parameters = type == MessageType::Init || type == MessageType::Pull ||
                                type == MessageType::Push || type == MessageType::PushPull ||
                                type == MessageType::Checkpoint;
  if (needs_parameters && !shard_.device_failure().empty())
    throw ShardDeviceFailed(shard_.device_failure());
  std::vector<const PsShard::Entry*> entries;

  switch (type) {
    case MessageType::Init: {
      if (!shard_.initialized()) {
        if (m.tensors.empty())
          return reply_error(peer, type, id, "not initialised yet (retry after the chief's Init)",
                             transport::kNotInitialised);
        const std::string problem = shard_.check_initial(m, r.tensor_data);
        if (!problem.empty())
          return reply_error(peer, type, id, problem, transport::kBadInitialTensor);
        shard_.initialize(m, r.tensor_data);
        model_order_ = m.extra;  // the chief's list of every parameter name, echoed to workers
      } else if (!m.tensors.empty()) {
        // Initialised already (restored, or by another chief): the Init's values are ignored,
        // but its parts must be the ones held here, or the workers would train a model of
        // another shape, or assemble parts that do not fit, from what this server serves.
        const std::string problem = init_mismatch(m);
        if (!problem.empty())
          return reply_error(peer, type, id, problem, transport::kBadInitialTensor);
        // A checkpoint written before the parameter list was kept has none: this Init's.
        if (model_order_.empty()) model_order_ = m.extra;
      }
      shard_.select({}, entries);
      return reply_tensors(peer, id, entries, model_order_);
    }
    case MessageType::Pull: {
      if (!shard_.initialized())
        return reply_error(peer, type, id, "not initialised yet",
                           transport::kNotInitialised);
      if (!m.tensors.empty())
        return reply_error(peer, type, id, "a Pull carries no tensors", transport::kTensorsInPull);
      const std::string problem = shard_.select(split_names(m.extra), entries);
      if (!problem.empty()) return reply_error(peer, type, id, problem, transport::kUnknownName);
      count(&ServerStats::pulls);
      return answer_or_defer(peer, id, split_names(m.extra));
    }
    case MessageType::Push:
    case MessageType::PushPull: {
      std::string kind = transport::kNotInitialised;
      std::string problem = shard_.initialized()
                                ? shard_.stage_gradients(m, r.tensor_data, kind)
                                : std::string("not initialised yet");
      if (!problem.empty()) {
        if (type == MessageType::PushPull) return reply_error(peer, type, id, problem, kind);
        count(&ServerStats::dropped);
        log_once("Push: " + kind, problem + " (dropped)");
        return;
      }
      return handle_push(peer, m);  // its gradients are staged in the shard
    }
    case MessageType::Stats:
      return reply_extra(peer, id, to_json(stats()));
    case MessageType::Checkpoint: {
      if (options_.checkpoint_dir.empty())
        return reply_error(peer, type, id, "checkpoints unsupported: no checkpoint_dir",
                           transport::kUnsupported);
      if (!shard_.initialized())
        return reply_error(peer, type, id, "not initialised yet",
                           transport::kNotInitialised);
      // Answered once the file is written (answer_checkpoint_requests, at every tick), not
      // waited for here: the write, fsyncs included, takes as long as the disk does.
      Pending p;
      p.peer.copy(const_cast<zmq::message_t&>(peer));
      p.request_id = id;
      try {
        p.ticket = submit_checkpoint();
      } catch (const std::exception& e) {  // no snapshot (no memory, a GPU shard's moments)
        return reply_error(peer, type, id, std::string("checkpoint failed: ") + e.what(),
                           transport::kCheckpointFailed);
      }
      checkpoint_requests_.push_back(std::move(p));
      return;
    }
    case MessageType::Idle: {
      if (!m.tensors.empty() || !m.extra.empty()) {
        count(&ServerStats::dropped);
        log_once("Idle: not empty", "an Idle message carries nothing (dropped)");
        return;
      }
      if (options_.mode == PsMode::Async) return;
      clocks_.idle(std::string(peer.data<char>(), peer.size()), Clock::now());
      // The step in progress may wait only for this worker's gradient: it need not.
      if (options_.mode == PsMode::Sync && shard_.pending() > 0 &&
          shard_.pending() >= replicas_needed(Clock::now()))
        finish_sync_step();
      return;
    }
    case MessageType::Shutdown:
      reply_extra(peer, id, "");
      stopping_ = true;  // serve() sees it after this message and closes the socket
      return;
    default:
      return reply_error(peer, type, id,
                         std::string("unsupported request ") + transport::to_string(type),
                         transport::kUnsupported);
  }
}

void ParameterServer::handle_push(const zmq::message_t& peer, const Message& m) {
  const bool reply = m.header.type == MessageType::PushPull;
  const uint64_t base = m.header.parameter_version;  // the version the gradient was computed on
  const uint64_t now_version = uint64_t(shard_.step());
  const int64_t staleness = base < now_version ? int64_t(now_version - base) : 0;
  const bool stale = options_.mode == PsMode::Sync && staleness > 0;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.staleness[staleness_bucket(staleness)];
    if (stale) ++stats_.stale_dropped;
    else ++stats_.pushes;
  }
  switch (options_.mode) {
    case PsMode::Async:
      shard_.apply_staged();
      break;
    case PsMode::Sync: {
      // Every valid push, stale or not, says its worker is still pushing (replicas_needed).
      clocks_.pushed(std::string(peer.data<char>(), peer.size()), Clock::now());
      if (stale) {
        // SyncReplicasOptimizer drops it; the worker gets the current parameters to go on with.
        if (!reply) return;
        std::vector<const PsShard::Entry*> entries;
        shard_.select({}, entries);
        int64_t dropped;
        {
          std::lock_guard<std::mutex> lock(stats_mutex_);
          dropped = stats_.stale_dropped;
        }
        return reply_tensors(peer, m.header.request_id, entries,
                             "stale (dropped: " + std::to_string(dropped) + ")");
      }
      shard_.accumulate_staged();
      if (shard_.pending() == 1) {
        // The step timeout, or longer for workers whose batches take longer (ps_worker_clocks.h).
        const auto now = Clock::now();
        step_deadline_ = now + std::max<Clock::duration>(
                                   std::chrono::milliseconds(std::min(
                                       options_.step_timeout_ms, options_.longest_wait_ms)),
                                   clocks_.slowest_gaps(now));  // (at most longest_wait_ms)
      }
      if (reply) {
        Pending p;
        p.peer.copy(const_cast<zmq::message_t&>(peer));
        p.request_id = m.header.request_id;
        held_.push_back(std::move(p));
      }
      if (shard_.pending() >= replicas_needed(Clock::now())) finish_sync_step();
      return;
    }
    case PsMode::BoundedStaleness:
      clocks_.pushed(std::string(peer.data<char>(), peer.size()), Clock::now());
      shard_.apply_staged();
      break;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.version = shard_.step();
  }
  if (reply) answer_or_defer(peer, m.header.request_id, {});
}

void ParameterServer::answer_or_defer(const zmq::message_t& peer, uint64_t request_id,
                                      std::vector<std::string> names) {
  Pending p;
  p.request_id = request_id;
  p.names = std::move(names);
  if (options_.mode == PsMode::BoundedStaleness &&
      clocks_.clock(std::string(peer.data<char>(), peer.size()), p.clock) &&
      !clocks_.within(p.clock, options_.staleness_bound, Clock::now())) {
    p.peer.copy(const_cast<zmq::message_t&>(peer));
    deferred_.push_back(std::move(p));
    count(&ServerStats::deferred);
    return;
  }
  std::vector<const PsShard::Entry*> entries;
  shard_.select(p.names, entries);  // names were checked when the request came
  reply_tensors(peer, request_id, entries);
}

void ParameterServer::reply_pending(const Pending& p) {
  // One failed send (a peer gone) must not lose the other held replies.
  try {
    std::vector<const PsShard::Entry*> entries;
    shard_.select(p.names, entries);
    reply_tensors(p.peer, p.request_id, entries);
  } catch (const std::exception& e) {
    log_failure(e);
  }
}

void ParameterServer::finish_sync_step() {
  if (shard_.pending() < options_.replicas_to_aggregate) count(&ServerStats::partial_steps);
  const int64_t gradients = shard_.pending();
  bool applied = false, failed = false;
  try {
    applied = shard_.apply_accumulated();
  } catch (const ShardDeviceFailed&) {
    fail_waiting_requests();  // the held workers, the one whose push completed the step too
    clocks_.clear_idle();
    return;
  } catch (const std::exception& e) {
    // (No memory for a parameter block: the shard is as it was.) The step is dropped, and the
    // held workers are answered with the parameters as they were, not left to time out.
    log_failure(e);
    failed = true;
  }
  if (!applied && !failed) {
    // The held workers still get the (unchanged) parameters, and go on.
    count(&ServerStats::overflowed_steps);
    log_once("sync step: overflow",
             "the mean of " + std::to_string(gradients) + " gradients is not finite (each one was, "
             "their float32 sum overflowed): step dropped, parameters left as they were");
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.version = shard_.step();
  }
  std::vector<Pending> held;
  held.swap(held_);
  for (const auto& p : held) reply_pending(p);
  clocks_.clear_idle();  // the next step waits for every worker again (an idle one says so again)
}

int ParameterServer::replicas_needed(Clock::time_point now) const {
  // Until replicas_to_aggregate workers have pushed at all, wait for all of them (the start),
  // but only until a step times out doing so: a worker killed before its first push would
  // otherwise make every step of the run wait out step_timeout_ms. After that, when fewer are
  // still pushing (one left for good, or never came), wait only for those; a late worker counts
  // again from its first push.
  if (clocks_.known() < options_.replicas_to_aggregate && !a_step_timed_out_)
    return options_.replicas_to_aggregate;
  return std::max(1, std::min(options_.replicas_to_aggregate, clocks_.active(now)));
}

void ParameterServer::on_tick() {
  answer_checkpoint_requests();  // (their snapshots were taken: a failed GPU does not matter)
  if (!shard_.device_failure().empty()) {
    if (!held_.empty() || !deferred_.empty()) fail_waiting_requests();
    return;  // nothing to step, defer or checkpoint any more
  }
  const auto now = Clock::now();
  if (options_.mode == PsMode::Sync && shard_.pending() > 0) {
    if (now >= step_deadline_) a_step_timed_out_ = true;
    // A worker left mid-step (or is very slow, or never came): do not hang the others.
    if (now >= step_deadline_ || shard_.pending() >= replicas_needed(now)) finish_sync_step();
  }
  if (options_.mode == PsMode::BoundedStaleness && !deferred_.empty()) {
    // Answer, in arrival order, every deferred request whose worker is now within the bound.
    std::deque<Pending> still;
    while (!deferred_.empty()) {
      Pending p = std::move(deferred_.front());
      deferred_.pop_front();
      if (clocks_.within(p.clock, options_.staleness_bound, now)) {
        reply_pending(p);
      } else {
        still.push_back(std::move(p));
      }
    }
    deferred_.swap(still);
  }
  // Last: a snapshot that cannot be taken (it throws) must not keep the replies above waiting.
  maybe_checkpoint(false);
}

}  // namespace tandem
