#include "ps_server.h"

#include <cstdio>
#include <cstring>

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
      clocks_(options_.worker_timeout_ms) {
  const std::string where = "parameter server at " + options_.bind;
  if (options_.replicas_to_aggregate < 1)
    throw InputError(where + ": replicas_to_aggregate must be at least 1");
  if (options_.staleness_bound < 0) throw InputError(where + ": staleness_bound must be >= 0");
  stats_.mode = to_string(options_.mode);
  try {
    if (options_.context == nullptr) {
      own_context_ = std::make_unique<zmq::context_t>(1);
      options_.context = own_context_.get();
    }
    socket_ = zmq::socket_t(*options_.context, zmq::socket_type::router);
    // A short linger: a Shutdown reply still leaves, but closing never waits long on dead peers.
    socket_.set(zmq::sockopt::linger, 200);
    // ZeroMQ drops a peer whose frame exceeds this before it reaches us (oversized messages).
    socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_message_bytes));
    socket_.bind(options_.bind);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    throw transport::TransportError(where + ": cannot bind: " + e.what());
  }
  thread_ = std::thread([this] { serve(); });
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

void ParameterServer::serve() {
  Frames frames;
  while (!stopping_) {
    try {
      // Deferred and held replies have deadlines: wait no longer than a poll interval.
      if (transport::receive_frames(socket_, frames, options_.poll_ms, endpoint_)) handle(frames);
      on_tick();
    } catch (const std::exception& e) {
      // A failed send to one peer (or a bad_alloc on one message) must not stop the server.
      log_once(std::string("internal: ") + e.what(), e.what());
    }
  }
  socket_.close();  // the socket belongs to this thread; nothing uses it after this
}

void ParameterServer::reply_error(const zmq::message_t& peer, MessageType type,
                                  uint64_t request_id, const std::string& text,
                                  const std::string& kind) {
  count(&ServerStats::rejected);
  // Type Error stands for "a request whose type could not be read" (see handle_malformed).
  log_once(std::string(type == MessageType::Error ? "unreadable request" : transport::to_string(type)) +
               ": " + kind,
           text);
  const auto out = transport::encode_message(
      transport::make_message(MessageType::Error, request_id, uint64_t(shard_.step()), {}, text),
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
  // send_message copies the frames, so later pushes cannot change a queued reply.
  const auto out = transport::encode_float_message(MessageType::Reply, request_id,
                                                   uint64_t(shard_.step()), refs, std::move(extra));
  transport::send_message(socket_, out, &peer, endpoint_);
}

void ParameterServer::handle_malformed(const Frames& frames, const DecodeResult& r) {
  const std::string kind = std::string("malformed: ") + transport::to_string(r.code);
  // An Error reply needs the request id: readable when frame 0 starts with the magic and is
  // long enough, even if the version or type is wrong (so the sender learns why).
  const bool addressable = frames.size() >= 2 && frames[1].size() >= 16 &&
                           read_u32(frames[1].data<uint8_t>()) == transport::kMagic;
  const bool one_way = r.header_ok && r.message.header.type == MessageType::Push;
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
    log_once("malformed: empty", "a message with no frames");
    return;
  }
  const DecodeResult r = transport::decode_frames(frames, 1, options_.limits);
  if (r.header_ok) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.by_type[transport::to_string(r.message.header.type)];
  }
  if (!r.ok()) return handle_malformed(frames, r);

  const zmq::message_t& peer = frames[0];
  const Message& m = r.message;
  const MessageType type = m.header.type;
  const uint64_t id = m.header.request_id;
  if (options_.mode == PsMode::BoundedStaleness)
    clocks_.heard(std::string(peer.data<char>(), peer.size()), Clock::now());
  std::vector<const PsShard::Entry*> entries;

  switch (type) {
    case MessageType::Init: {
      if (!shard_.initialized()) {
        if (m.tensors.empty())
          return reply_error(peer, type, id, "not initialised yet (retry after the chief's Init)",
                             "not initialised");
        const std::string problem = shard_.check_initial(m, r.tensor_data);
        if (!problem.empty()) return reply_error(peer, type, id, problem, "bad initial tensor");
        shard_.initialize(m, r.tensor_data);
        model_order_ = m.extra;  // the chief's list of every parameter name, echoed to workers
      }
      shard_.select({}, entries);
      return reply_tensors(peer, id, entries, model_order_);
    }
    case MessageType::Pull: {
      if (!shard_.initialized())
        return reply_error(peer, type, id, "not initialised yet", "not initialised");
      if (!m.tensors.empty())
        return reply_error(peer, type, id, "a Pull carries no tensors", "tensors in a Pull");
      const std::string problem = shard_.select(split_names(m.extra), entries);
      if (!problem.empty()) return reply_error(peer, type, id, problem, "unknown name");
      count(&ServerStats::pulls);
      return answer_or_defer(peer, id, split_names(m.extra));
    }
    case MessageType::Push:
    case MessageType::PushPull: {
      std::string kind = "not initialised";
      std::string problem = shard_.initialized()
                                ? shard_.check_gradients(m, r.tensor_data, kind)
                                : std::string("not initialised yet");
      if (!problem.empty()) {
        if (type == MessageType::PushPull) return reply_error(peer, type, id, problem, kind);
        count(&ServerStats::dropped);
        log_once("Push: " + kind, problem + " (dropped)");
        return;
      }
      return handle_push(peer, m, r.tensor_data);
    }
    case MessageType::Stats:
      return reply_extra(peer, id, to_json(stats()));
    case MessageType::Shutdown:
      reply_extra(peer, id, "");
      stopping_ = true;  // serve() sees it after this message and closes the socket
      return;
    default:
      return reply_error(peer, type, id,
                         std::string("unsupported request ") + transport::to_string(type),
                         "unsupported");
  }
}

void ParameterServer::handle_push(const zmq::message_t& peer, const Message& m,
                                  const std::vector<ByteSpan>& data) {
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
      shard_.apply(m, data);
      break;
    case PsMode::Sync: {
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
      shard_.accumulate(m, data);
      if (shard_.pending() == 1)
        step_deadline_ = Clock::now() + std::chrono::milliseconds(options_.step_timeout_ms);
      if (reply) {
        Pending p;
        p.peer.copy(const_cast<zmq::message_t&>(peer));
        p.request_id = m.header.request_id;
        held_.push_back(std::move(p));
      }
      if (shard_.pending() >= options_.replicas_to_aggregate) finish_sync_step();
      return;
    }
    case PsMode::BoundedStaleness:
      clocks_.pushed(std::string(peer.data<char>(), peer.size()), base, Clock::now());
      shard_.apply(m, data);
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
    log_once(std::string("internal: ") + e.what(), e.what());
  }
}

void ParameterServer::finish_sync_step() {
  if (shard_.pending() < options_.replicas_to_aggregate) count(&ServerStats::partial_steps);
  shard_.apply_accumulated();
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.version = shard_.step();
  }
  std::vector<Pending> held;
  held.swap(held_);
  for (const auto& p : held) reply_pending(p);
}

void ParameterServer::on_tick() {
  const auto now = Clock::now();
  if (options_.mode == PsMode::Sync && shard_.pending() > 0 && now >= step_deadline_)
    finish_sync_step();  // a worker left mid-step (or is very slow): do not hang the others
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
}

}  // namespace tandem
