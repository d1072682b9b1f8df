#include "ps_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "ps_placement.h"
#include "curve_client.h"

namespace tandem {

using transport::DecodeResult;
using transport::FloatTensorRef;
using transport::Frames;
using transport::MessageType;
using transport::TransportError;
using Clock = std::chrono::steady_clock;

namespace {

// A request's deadline passed (its server's connection has been reset): collect() resets the
// connections of the handle's other unanswered servers too.
class RequestTimedOut : public TransportError {
 public:
  using TransportError::TransportError;
};

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<bool> holding(const std::vector<std::vector<FloatTensorRef>>& per_server) {
  std::vector<bool> out;
  for (const auto& v : per_server) out.push_back(!v.empty());
  return out;
}

// A server's Error reply: its text for people, its kind for the caller to act on.
ServerError error_reply(const std::string& where, const transport::Message& reply) {
  const transport::ErrorReason reason = transport::decode_error_reason(reply.extra);
  return ServerError(where + ": " + reason.text, reason.kind);
}

}  // namespace

PsClient::PsClient(std::vector<std::string> server_endpoints, ClientOptions options)
    : options_(std::move(options)), endpoints_(std::move(server_endpoints)) {
  if (endpoints_.empty()) throw InputError("parameter server client: no server endpoints");
  const std::vector<std::string> server_keys = curve_setup();
  if (options_.context == nullptr) {
    own_context_ = std::make_unique<zmq::context_t>(1);
    options_.context = own_context_.get();
  }
  for (size_t s = 0; s < endpoints_.size(); ++s) {
    auto server = std::make_unique<Server>();
    server->endpoint = endpoints_[s];
    server->where = "parameter server " + server->endpoint;
    server->curve_key = server_keys[s];
    open_socket(*server);
    servers_.push_back(std::move(server));
  }
}

void PsClient::open_socket(Server& server) {
  // Made aside and swapped in whole: a failure leaves the server as it was.
  zmq::socket_t socket;
  transport::CurveHandshakeWatch handshakes;
  try {
    socket = zmq::socket_t(*options_.context, zmq::socket_type::dealer);
    // Requests to a server that is gone are abandoned, never waited on at close.
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndtimeo, options_.timeout_ms);
    // A reply's frames are bounded as a server bounds requests' (wire_protocol.h, DecodeLimits).
    socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_message_bytes));
    if (!server.curve_key.empty()) {  // before connect, as the handshake starts there
      socket.set(zmq::sockopt::curve_serverkey, server.curve_key);
      socket.set(zmq::sockopt::curve_publickey, options_.curve_public_key);
      socket.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
      handshakes =
          transport::CurveHandshakeWatch(*options_.context, socket, options_.curve_public_key);
    }
    socket.connect(server.endpoint);
  } catch (const zmq::error_t& e) {
    throw TransportError("parameter server " + server.endpoint + ": cannot connect: " + e.what());
  }
  server.handshakes = transport::CurveHandshakeWatch();  // (watches the old socket: closed first)
  // The old socket, if any, closes here; its linger of 0 drops what it still queued.
  server.socket = std::move(socket);
  server.handshakes = std::move(handshakes);
}

void PsClient::reset_connection(Server& server) {
  // Replies to the requests sent on the old socket can no longer come (those already here, in
  // `early`, are kept for their handles).
  server.outstanding.clear();
  open_socket(server);
  ++server.generation;
}

PsClient::~PsClient() = default;

std::vector<std::string> PsClient::curve_setup() {
  const size_t n = endpoints_.size();
  if (!options_.curve_server_keys.empty() && options_.curve_server_keys.size() != n)
    throw InputError("parameter server client: " + std::to_string(options_.curve_server_keys.size()) +
                     " curve_server_keys for " + std::to_string(n) + " endpoints");
  std::vector<std::string> keys(n, options_.curve_server_key);
  std::string any;  // one server's key, to check the client's pair against
  for (size_t s = 0; s < n; ++s) {
    if (!options_.curve_server_keys.empty() && !options_.curve_server_keys[s].empty())
      keys[s] = options_.curve_server_keys[s];
    if (keys[s].empty()) continue;
    any = keys[s];
    transport::validate_curve_key(keys[s], "parameter server " + endpoints_[s] +
                                               ": curve server key");
  }
  // Completes the client's pair (a throwaway one when none is given), or refuses a pair
  // without any server key.
  const transport::CurveClientKeys resolved = transport::resolve_curve_client(
      {any, {options_.curve_public_key, options_.curve_secret_key}}, "parameter server client");
  if (any.empty()) return keys;
  options_.curve_public_key = resolved.client.public_key;
  options_.curve_secret_key = resolved.client.secret_key;
  return keys;
}

std::vector<bool> PsClient::all_servers() const { return std::vector<bool>(servers_.size(), true); }

void PsClient::require_init(const char* what) const {
  if (names_.empty())
    throw InputError(std::string("parameter server client: ") + what +
                     " before init() finished on this client");
}

PsClient::Handle PsClient::send_each(MessageType type,
                                     const std::vector<std::vector<FloatTensorRef>>& per_server,
                                     const std::vector<std::string>& extra,
                                     const std::vector<bool>& involved,
                                     const std::shared_ptr<transport::SendHold>& hold,
                                     const std::vector<uint64_t>* versions) {
  // A stopping client sends nothing: a send to a server that has stopped with it (inproc, no
  // peer left) would wait out the whole timeout.
  if (options_.cancel && *options_.cancel)
    throw TransportError(std::string("parameter server client: ") + transport::to_string(type) +
                         " not sent: this client is stopping");
  Handle handle;
  handle.client_ = this;
  handle.type_ = type;
  handle.deadline_ = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  // Every message is made, and its size checked, before any is sent: a refusal leaves no server
  // with its part of a Push or Init. A server refuses a frame over its limit by dropping the
  // connection, which the client would only see as a timeout: said here instead (the servers'
  // limit is this client's).
  std::vector<transport::OutgoingMessage> outs(servers_.size());
  std::vector<uint64_t> ids(servers_.size(), 0);
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (!involved[s]) continue;
    Server& server = *servers_[s];
    const uint64_t version = versions != nullptr ? versions->at(s) : server.last_version;
    ids[s] = next_request_id_ + s;
    outs[s] = transport::encode_float_message(type, ids[s], version, per_server[s], extra[s]);
    size_t bytes = outs[s].header_frame.size();
    for (const auto& frame : outs[s].tensor_frames) bytes += frame.size;
    if (bytes > options_.limits.max_message_bytes)
      throw InputError("parameter server client: a " + std::string(transport::to_string(type)) +
                       " to " + server.where + " would be " + std::to_string(bytes) +
                       " bytes, over the servers' limit of " +
                       std::to_string(options_.limits.max_message_bytes) +
                       " bytes a message: use more servers (a large tensor is split across them)");
  }
  next_request_id_ += servers_.size();
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (!involved[s]) continue;
    const uint64_t id = ids[s];
    Server& server = *servers_[s];
    const transport::OutgoingMessage& out = outs[s];
    try {
      transport::send_message(server.socket, out, nullptr,
                              "parameter server " + server.endpoint + " (" +
                                  transport::to_string(type) + ")",
                              hold);
    } catch (const TransportError& e) {
      // libzmq drops a connection whose handshake failed for good (no reconnect), so a refused
      // client's later sends find no peer and time out: say why.
      const std::string& why =
          server.handshakes.problem(transport::CurveHandshakeWatch::kEventWaitMs);
      if (why.empty()) throw;
      throw TransportError(std::string(e.what()) + ": " + why);
    }
    if (type != MessageType::Push && type != MessageType::Idle) {
      server.outstanding.insert(id);
      handle.parts_.push_back({s, id, server.generation});
    }
  }
  return handle;
}

PsClient::Handle PsClient::init(const std::vector<NamedTensor>& tensors) {
  const size_t n = servers_.size();
  std::vector<std::vector<FloatTensorRef>> per_server(n);
  std::vector<std::string> extra(n);
  if (tensors.empty()) return send_each(MessageType::Init, per_server, extra, all_servers());
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::string order;
  for (const auto& t : tensors) {
    if (int64_t(t.values.size()) != element_count(t.shape))
      throw InputError("parameter server client: tensor '" + t.name + "' has " +
                       std::to_string(t.values.size()) + " values for its shape");
    names.push_back(t.name);
    shapes.push_back(t.shape);
    order += t.name + "\n";
  }
  // Each part a view of its rows: a row range of a row-major tensor is one contiguous slice.
  for (const auto& part : place_parts(names, shapes, int(n), options_.split_tensors))
    per_server[size_t(part.server)].push_back(
        {part.name, part.shape, tensors[part.tensor].values.data() + part.offset});
  refuse_servers_left_empty(per_server, names, shapes);
  for (auto& e : extra) e = order;  // the full names: workers learn the model's order from it
  return send_each(MessageType::Init, per_server, extra, all_servers());
}

// A server the placement leaves without a part would never be initialised, and the other
// workers, who ask every server (they do not know the model's shapes), would wait for it until
// their init timeout, then fail. Said before anything is sent, with the most servers this model
// fills.
void PsClient::refuse_servers_left_empty(const std::vector<std::vector<FloatTensorRef>>& parts,
                                         const std::vector<std::string>& names,
                                         const std::vector<std::vector<int64_t>>& shapes) const {
  std::string empty;
  for (size_t s = 0; s < parts.size(); ++s)
    if (parts[s].empty()) empty += (empty.empty() ? "" : ", ") + servers_[s]->where;
  if (empty.empty()) return;
  int most = int(parts.size()) - 1;
  for (; most > 1; --most) {
    std::vector<bool> holds(size_t(most), false);
    for (const auto& part : place_parts(names, shapes, most, options_.split_tensors))
      holds[size_t(part.server)] = true;
    if (std::find(holds.begin(), holds.end(), false) == holds.end()) break;
  }
  const bool one = empty.find(", ") == std::string::npos;
  throw InputError("parameter server client: this model (" + std::to_string(names.size()) +
                   (names.size() == 1 ? " tensor" : " tensors") + ") leaves " + empty +
                   " without a part of it, and the workers would wait for " +
                   (one ? "that server" : "those servers") + " until their init timeout: " +
                   "use at most " + std::to_string(most) + " parameter servers for it");
}

PsClient::Handle PsClient::pull() {
  require_init("pull()");
  std::vector<std::vector<FloatTensorRef>> none(servers_.size());
  std::vector<bool> holds(servers_.size(), false);
  for (const auto& part : layout_) holds[size_t(part.server)] = true;  // only servers that hold some
  return send_each(MessageType::Pull, none, std::vector<std::string>(servers_.size()), holds);
}

void PsClient::idle() {
  // Said every 50 ms while a worker has no batch. To a server that is gone, the messages would
  // pile up in the socket up to its high-water mark, and then each send would wait out the send
  // timeout (timeout_ms), holding up the worker's polling for work that long: so an Idle that
  // cannot be queued at once is dropped (it is advisory), and each server gets its own try.
  // (Sent here, not through send_each, whose failure path waits for a CURVE handshake's news.)
  if (options_.cancel && *options_.cancel) return;
  for (const auto& server : servers_) {
    const auto out =
        transport::encode_float_message(MessageType::Idle, next_request_id_++, server->last_version,
                                        {});
    zmq::socket_t& socket = server->socket;
    socket.set(zmq::sockopt::sndtimeo, 0);
    try {
      transport::send_message(socket, out, nullptr, server->where + " (Idle)");
    } catch (const TransportError&) {
    } catch (...) {
      socket.set(zmq::sockopt::sndtimeo, options_.timeout_ms);
      throw;
    }
    socket.set(zmq::sockopt::sndtimeo, options_.timeout_ms);
  }
}

PsClient::Handle PsClient::send_gradients(MessageType type,
                                          const std::vector<NamedTensor>& gradients,
                                          const std::shared_ptr<transport::SendHold>& hold,
                                          const std::vector<uint64_t>* versions) {
  require_init(transport::to_string(type));
  if (versions != nullptr && versions->size() != servers_.size())
    throw InputError("parameter server client: " + std::to_string(versions->size()) +
                     " versions for " + std::to_string(servers_.size()) + " servers");
  // Every parameter exactly once, in its own shape (a split one could not be sliced otherwise).
  std::vector<const NamedTensor*> by_tensor(names_.size(), nullptr);
  for (const auto& g : gradients) {
    const auto it = index_.find(g.name);
    if (it == index_.end())
      throw InputError("parameter server client: gradient for unknown parameter '" + g.name + "'");
    if (int64_t(g.values.size()) != element_count(g.shape))
      throw InputError("parameter server client: gradient '" + g.name + "' has " +
                       std::to_string(g.values.size()) + " values for its shape");
    if (g.shape != shapes_[it->second])
      throw InputError("parameter server client: gradient '" + g.name +
                       "' does not have its parameter's shape");
    if (by_tensor[it->second] != nullptr)
      throw InputError("parameter server client: two gradients for '" + g.name + "'");
    by_tensor[it->second] = &g;
  }
  for (size_t t = 0; t < names_.size(); ++t)
    if (by_tensor[t] == nullptr)
      throw InputError("parameter server client: the push lacks a gradient for '" + names_[t] +
                       "' (a push carries one for every parameter)");
  std::vector<std::vector<FloatTensorRef>> per_server(servers_.size());
  for (const auto& part : layout_)  // views of each part's rows, no copy
    per_server[size_t(part.server)].push_back(
        {part.name, part.shape, by_tensor[part.tensor]->values.data() + part.offset});
  return send_each(type, per_server, std::vector<std::string>(servers_.size()),
                   holding(per_server), hold, versions);
}

PsClient::Handle PsClient::push(const std::vector<NamedTensor>& gradients) {
  return send_gradients(MessageType::Push, gradients, nullptr);
}

PsClient::Handle PsClient::push_pull(const std::vector<NamedTensor>& gradients) {
  return send_gradients(MessageType::PushPull, gradients, nullptr);
}

PsClient::Handle PsClient::push(const std::shared_ptr<GradientBuffer>& gradients) {
  return send_gradients(MessageType::Push, gradients->value, gradients);
}

PsClient::Handle PsClient::push_pull(const std::shared_ptr<GradientBuffer>& gradients,
                                     const std::vector<uint64_t>* computed_on) {
  return send_gradients(MessageType::PushPull, gradients->value, gradients, computed_on);
}

std::vector<uint64_t> PsClient::versions() const {
  std::vector<uint64_t> out;
  for (const auto& server : servers_) out.push_back(server->last_version);
  return out;
}

bool PsClient::spin_for_reply(Server& server, Frames& frames, Clock::time_point deadline) {
  if (options_.spin_us <= 0) return false;
  const auto until =
      std::min(deadline, Clock::now() + std::chrono::microseconds(options_.spin_us));
  do {
    if (transport::receive_frames(server.socket, frames, 0, server.where)) return true;
  } while (Clock::now() < until && !(options_.cancel && *options_.cancel));
  return false;
}

Frames PsClient::await(const Handle::Part& part, Clock::time_point deadline, MessageType type) {
  const uint64_t request_id = part.request_id;
  Server& server = *servers_[part.server];
  const std::string& where = server.where;
  // At the deadline, one last look without waiting: the reply may have sat in the socket while
  // an earlier part of the handle used up the time (the deadline is shared).
  bool looked_last = false;
  for (;;) {
    const auto early = server.early.find(request_id);
    if (early != server.early.end()) {
      Frames frames = std::move(early->second);
      server.early.erase(early);
      server.outstanding.erase(request_id);
      return frames;
    }
    if (part.generation != server.generation)  // (and its socket with it: no reset now)
      throw TransportError(where + ": " + transport::to_string(type) + " request " +
                           std::to_string(request_id) + " was dropped when the connection was " +
                           "reset after another request to this server timed out");
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 && looked_last) {
      std::string why = server.handshakes.problem();
      // A server that is gone has not read this request: it waits in the socket's queue, and a
      // server started again at the address would read it and apply it (a gradient the caller
      // has given up on and may send again). A new socket drops the queue, and with it every
      // request still unanswered there (awaited, each says it was dropped).
      try {
        reset_connection(server);
      } catch (const TransportError& e) {
        why += std::string(why.empty() ? "" : "; ") + "and the connection could not be reset (" +
               e.what() + ")";
      }
      throw RequestTimedOut(where + " did not answer " + transport::to_string(type) +
                            " request " + std::to_string(request_id) + " within " +
                            std::to_string(options_.timeout_ms) + " ms" +
                            (why.empty() ? "" : ": " + why));
    }
    if (options_.cancel && *options_.cancel) {
      server.outstanding.erase(request_id);
      throw TransportError(where + ": " + transport::to_string(type) + " request " +
                           std::to_string(request_id) + " abandoned: this client is stopping");
    }
    Frames frames;
    // What is left after the spin (which may use up to all of it), so the wait ends by the
    // deadline all the same.
    const bool spun = spin_for_reply(server, frames, deadline);
    const auto after_spin =
        spun ? left
             : std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
                   .count();
    const long slice = after_spin <= 0                 ? 0
                       : options_.cancel               ? std::min<long>(long(after_spin), 100)
                                                       : long(after_spin);
    if (!spun && !transport::receive_frames(server.socket, frames, slice, where)) {
      looked_last = left <= 0;
      continue;
    }
    const DecodeResult r = transport::decode_frames(frames, 0, options_.limits);
    if (!r.header_ok)
      throw TransportError(where + " sent an unreadable reply: " + r.error);
    const uint64_t id = r.message.header.request_id;
    if (id == request_id) {
      server.outstanding.erase(request_id);
      return frames;
    }
    // Frames are kept whole (not the decoded spans: they would dangle once the frames move).
    if (server.outstanding.count(id) != 0) server.early[id] = std::move(frames);
  }
}

void PsClient::keep_waiting_replies(Server& server) noexcept {
  try {
    for (;;) {
      Frames frames;
      if (!transport::receive_frames(server.socket, frames, 0, server.where)) return;
      const DecodeResult r = transport::decode_frames(frames, 0, options_.limits);
      if (!r.header_ok) continue;  // unreadable: its request is reset with the others
      const uint64_t id = r.message.header.request_id;
      if (server.outstanding.count(id) != 0) server.early[id] = std::move(frames);
    }
  } catch (const TransportError&) {
  }
}

PsResult PsClient::collect(Handle& handle, ReceivedParameters& into) {
  try {
    return collect_replies(handle, into);
  } catch (const RequestTimedOut&) {
    reset_unanswered(handle);
    forget(handle);
    throw;
  } catch (...) {
    forget(handle);  // the other servers' replies to this handle will not be waited for
    throw;
  }
}

void PsClient::reset_unanswered(const Handle& handle) noexcept {
  // One server timed out (its connection reset) and the handle's deadline, shared, has passed:
  // the other servers whose part is still unanswered may be gone too, their request queued for
  // a server started later. Their connections are reset as well.
  for (const Handle::Part& part : handle.parts_) {
    Server& server = *servers_[part.server];
    // Replies already waiting in the socket are read first: a server that answered is not
    // reset (that would drop its other requests in flight).
    keep_waiting_replies(server);
    // (A reset clears `outstanding`: a part no longer there was reset already, or answered.)
    if (server.outstanding.count(part.request_id) == 0 || server.early.count(part.request_id) != 0)
      continue;
    try {
      reset_connection(server);
    } catch (const TransportError&) {
    }
  }
}

PsResult PsClient::collect_replies(Handle& handle, ReceivedParameters& into) {
  PsResult result;
  result.version = UINT64_MAX;
  // No parameters until every reply is in and checked (storage kept: a step allocates nothing).
  into.runs_.shapes = nullptr;
  into.runs_.runs.clear();
  into.names_ = nullptr;
  // Every reply kept until the end (an Init's layout is known only once all are in), in slots
  // that do not move once filled: the decoded spans and the runs point into them.
  into.frames_.resize(handle.parts_.size());
  std::vector<DecodeResult> replies(handle.parts_.size());
  std::vector<std::pair<transport::TensorInfo, size_t>> held;  // an Init's: part, server
  std::string order;
  // Servers without parameters yet, each "SERVER: its text": an Init (a worker waiting for the
  // chief's) hears from all of them, so that its wait, and its error, names every server still
  // waiting rather than the first. Other requests throw at the first error, as for any other.
  std::string not_initialised;
  for (size_t k = 0; k < handle.parts_.size(); ++k) {
    const auto& part = handle.parts_[k];
    const std::string& where = servers_[part.server]->where;
    into.frames_[k] = await(part, handle.deadline_, handle.type_);
    replies[k] = transport::decode_frames(into.frames_[k], 0, options_.limits);
    const DecodeResult& r = replies[k];
    if (!r.ok()) throw TransportError(where + " sent a malformed reply: " + r.error);
    if (r.message.header.type == MessageType::Error) {
      ServerError e = error_reply(where, r.message);
      if (!e.not_initialised() || handle.type_ != MessageType::Init) throw e;
      not_initialised += (not_initialised.empty() ? "" : "; ") + std::string(e.what());
      continue;
    }
    if (r.message.header.type != MessageType::Reply)
      throw TransportError(where + " answered with a " +
                           transport::to_string(r.message.header.type) + ", not a Reply");
    result.version = std::min(result.version, r.message.header.parameter_version);
    Server& server = *servers_[part.server];
    if (part.request_id >= server.last_version_request) {  // (replies may come out of order)
      server.last_version = r.message.header.parameter_version;
      server.last_version_request = part.request_id;
    }
    if (handle.type_ == MessageType::PushPull && r.message.extra.rfind("stale", 0) == 0)
      result.stale = true;
    if (handle.type_ == MessageType::Init) {
      if (order.empty()) order = r.message.extra;
      for (const auto& info : r.message.tensors) held.push_back({info, part.server});
    }
  }
  if (!not_initialised.empty()) throw ServerError(not_initialised, transport::kNotInitialised);
  if (handle.parts_.empty()) result.version = 0;
  // Learn the model's order and who holds which part (a chief learns it back from its own Init).
  if (handle.type_ == MessageType::Init) learn_layout(order, held);
  const bool carries_parameters = handle.type_ == MessageType::Init ||
                                  handle.type_ == MessageType::Pull ||
                                  handle.type_ == MessageType::PushPull;
  if (!carries_parameters || names_.empty() || handle.parts_.empty()) return result;
  // Each part's values are a run of its tensor's elements (its rows); the parts tile each tensor
  // (learn_layout checked), so once every part is here every element is covered.
  std::vector<bool> got(layout_.size(), false);
  for (size_t k = 0; k < replies.size(); ++k) {
    const DecodeResult& r = replies[k];
    const std::string& where = servers_[handle.parts_[k].server]->where;
    for (size_t i = 0; i < r.message.tensors.size(); ++i) {
      const auto& info = r.message.tensors[i];
      const auto it = part_index_.find(info.name);
      if (it == part_index_.end())
        throw ServerError(where + " sent '" + info.name + "', no part of this model");
      const TensorPart& p = layout_[it->second];
      if (info.shape != p.shape || info.dtype != transport::DType::Float32)
        throw ServerError(where + " sent '" + info.name + "' in another shape or dtype than at init");
      into.runs_.runs.push_back({p.tensor, p.offset, p.size, r.tensor_data[i].data});
      got[it->second] = true;
    }
  }
  for (size_t p = 0; p < layout_.size(); ++p)
    if (!got[p]) throw ServerError("parameter servers: reply lacks '" + layout_[p].name + "'");
  into.runs_.shapes = &shapes_;
  into.names_ = &names_;
  return result;
}

PsResult PsClient::collect_copy(Handle& handle, std::vector<NamedTensor>* out) {
  PsResult result = collect(handle, scratch_);
  if (scratch_.runs_.shapes != nullptr) scratch_.copy_into(out != nullptr ? *out : result.tensors);
  return result;
}

void ReceivedParameters::copy_into(std::vector<NamedTensor>& tensors) const {
  if (runs_.shapes == nullptr || names_ == nullptr)
    throw InputError("parameter server client: no parameters received to copy");
  const auto& shapes = *runs_.shapes;
  tensors.resize(shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) {
    if (tensors[t].name != (*names_)[t]) tensors[t].name = (*names_)[t];
    if (tensors[t].shape != shapes[t]) tensors[t].shape = shapes[t];
    tensors[t].values.resize(size_t(element_count(shapes[t])));
  }
  // Frames may sit at any byte offset: memcpy copes with any alignment.
  for (const auto& run : runs_.runs)
    std::memcpy(tensors[run.tensor].values.data() + run.offset, run.bytes,
                size_t(run.count) * sizeof(float));
}

void PsClient::learn_layout(const std::string& order,
                            const std::vector<std::pair<transport::TensorInfo, size_t>>& held) {
  // Each part held: its tensor's name and rows ("NAME[BEGIN:END]", or a whole tensor's name).
  struct Seen {
    std::string name;
    std::vector<int64_t> shape;
    int64_t row_begin = 0, row_end = 0;
    size_t server = 0;
  };
  std::vector<std::string> names = split_lines(order);
  std::set<std::string> known(names.begin(), names.end());
  std::map<std::string, std::vector<Seen>> parts;  // tensor name -> its parts
  for (const auto& [info, server] : held) {
    std::string tensor = info.name;
    int64_t begin = 0, end = row_count(info.shape);
    // A name in the model's order is a whole tensor even if it looks like a part's.
    if (known.count(info.name) == 0 && !parse_part_name(info.name, tensor, begin, end)) {
      tensor = info.name;
      begin = 0;
      end = row_count(info.shape);
    }
    parts[tensor].push_back({info.name, info.shape, begin, end, server});
  }
  if (names.empty())
    for (const auto& kv : parts) names.push_back(kv.first);
  // Built aside and swapped in whole: a layout that does not tile leaves the client's as it was.
  std::vector<std::string> new_names;
  std::vector<std::vector<int64_t>> new_shapes;
  std::vector<TensorPart> new_layout;
  std::map<std::string, size_t> new_index, new_part_index;
  for (const auto& name : names) {
    auto it = parts.find(name);
    if (it == parts.end())
      throw ServerError("parameter servers: no server holds parameter '" + name +
                        "' (initialisation incomplete)");
    std::vector<Seen>& seen = it->second;
    std::sort(seen.begin(), seen.end(),
              [](const Seen& a, const Seen& b) { return a.row_begin < b.row_begin; });
    // The parts must tile rows 0..R with the same row shape; then they make the whole tensor.
    const bool whole = seen.size() == 1 && seen[0].name == name;
    std::vector<int64_t> shape = seen[0].shape;
    int64_t next_row = 0;
    for (const auto& p : seen) {
      const bool fits =
          whole || (!p.shape.empty() && p.shape[0] == p.row_end - p.row_begin &&
                    p.row_begin == next_row &&
                    std::equal(p.shape.begin() + 1, p.shape.end(), shape.begin() + 1, shape.end()));
      if (!fits)
        throw ServerError("parameter servers: the parts of '" + name +
                          "' do not make one tensor (at '" + p.name + "')");
      next_row = p.row_end;
    }
    if (!whole) shape[0] = next_row;
    const size_t t = new_names.size();
    new_index[name] = t;
    new_names.push_back(name);
    new_shapes.push_back(shape);
    const int64_t per_row = row_size(shape);
    for (const auto& p : seen) {
      TensorPart part;
      part.tensor = t;
      part.name = p.name;
      part.shape = p.shape;
      part.row_begin = p.row_begin;
      part.row_end = p.row_end;
      part.offset = p.row_begin * per_row;
      part.size = element_count(p.shape);
      part.server = int(p.server);
      new_part_index[p.name] = new_layout.size();
      new_layout.push_back(std::move(part));
    }
  }
  if (new_part_index.size() != held.size())
    throw ServerError("parameter servers: they hold parts that are no parameter of the model, "
                      "or one part twice");
  names_ = std::move(new_names);
  shapes_ = std::move(new_shapes);
  layout_ = std::move(new_layout);
  index_ = std::move(new_index);
  part_index_ = std::move(new_part_index);
}

PsClient::Handle& PsClient::Handle::operator=(Handle&& other) noexcept {
  if (this == &other) return *this;
  if (client_ != nullptr && !waited_) client_->forget(*this);
  client_ = std::exchange(other.client_, nullptr);
  type_ = other.type_;
  parts_ = std::move(other.parts_);
  other.parts_.clear();
  deadline_ = other.deadline_;
  waited_ = other.waited_;
  return *this;
}

PsClient::Handle::~Handle() {
  if (client_ != nullptr && !waited_) client_->forget(*this);
}

size_t PsClient::requests_in_flight() const {
  size_t n = 0;
  for (const auto& server : servers_) n += server->outstanding.size() + server->early.size();
  return n;
}

void PsClient::forget(const Handle& handle) noexcept {
  for (const Handle::Part& part : handle.parts_) {
    Server& server = *servers_[part.server];
    server.outstanding.erase(part.request_id);
    server.early.erase(part.request_id);
  }
}

PsResult PsClient::Handle::wait() {
  if (client_ == nullptr) return {};
  if (waited_) throw InputError("parameter server client: Handle::wait() called twice");
  waited_ = true;
  return client_->collect_copy(*this, nullptr);
}

PsResult PsClient::Handle::wait_into(std::vector<NamedTensor>& parameters) {
  if (client_ == nullptr) return {};
  if (waited_) throw InputError("parameter server client: Handle::wait() called twice");
  waited_ = true;
  return client_->collect_copy(*this, &parameters);
}

PsResult PsClient::Handle::wait_in_place(ReceivedParameters& parameters) {
  if (client_ == nullptr) return {};
  if (waited_) throw InputError("parameter server client: Handle::wait() called twice");
  if (type_ != MessageType::Init && type_ != MessageType::Pull && type_ != MessageType::PushPull)
    throw InputError(std::string("parameter server client: wait_in_place() on a ") +
                     transport::to_string(type_) + ", which brings no parameters");
  waited_ = true;
  return client_->collect(*this, parameters);
}

std::vector<ServerStats> PsClient::stats() {
  std::vector<std::vector<FloatTensorRef>> none(servers_.size());
  Handle handle = send_each(MessageType::Stats, none, std::vector<std::string>(servers_.size()),
                            all_servers());
  std::vector<ServerStats> out;
  for (const auto& part : handle.parts_) {
    const Frames frames = await(part, handle.deadline_, handle.type_);
    const DecodeResult r = transport::decode_frames(frames, 0, options_.limits);
    const std::string& where = servers_[part.server]->where;
    if (!r.ok()) throw TransportError(where + " sent a malformed reply: " + r.error);
    if (r.message.header.type == MessageType::Error) throw error_reply(where, r.message);
    if (r.message.header.type != MessageType::Reply)
      throw TransportError(where + " answered with a " +
                           transport::to_string(r.message.header.type) + ", not a Reply");
    out.push_back(stats_from_json(r.message.extra));
  }
  return out;
}

void PsClient::shutdown_servers() {
  std::vector<std::vector<FloatTensorRef>> none(servers_.size());
  Handle handle = send_each(MessageType::Shutdown, none,
                            std::vector<std::string>(servers_.size()), all_servers());
  handle.wait();
}

}  // namespace tandem
