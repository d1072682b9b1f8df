#include "ps_client.h"

#include <cstring>

#include "ps_placement.h"

namespace tandem {

using transport::DecodeResult;
using transport::FloatTensorRef;
using transport::Frames;
using transport::MessageType;
using transport::TransportError;
using Clock = std::chrono::steady_clock;

namespace {

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

}  // namespace

PsClient::PsClient(std::vector<std::string> server_endpoints, ClientOptions options)
    : options_(std::move(options)), endpoints_(std::move(server_endpoints)) {
  if (endpoints_.empty()) throw InputError("parameter server client: no server endpoints");
  if (options_.context == nullptr) {
    own_context_ = std::make_unique<zmq::context_t>(1);
    options_.context = own_context_.get();
  }
  for (const auto& endpoint : endpoints_) {
    auto server = std::make_unique<Server>();
    server->endpoint = endpoint;
    try {
      server->socket = zmq::socket_t(*options_.context, zmq::socket_type::dealer);
      // Requests to a server that is gone are abandoned, never waited on at close.
      server->socket.set(zmq::sockopt::linger, 0);
      server->socket.set(zmq::sockopt::sndtimeo, options_.timeout_ms);
      server->socket.connect(endpoint);
    } catch (const zmq::error_t& e) {
      throw TransportError("parameter server " + endpoint + ": cannot connect: " + e.what());
    }
    servers_.push_back(std::move(server));
  }
}

PsClient::~PsClient() = default;

std::vector<bool> PsClient::all_servers() const { return std::vector<bool>(servers_.size(), true); }

void PsClient::require_init(const char* what) const {
  if (names_.empty())
    throw InputError(std::string("parameter server client: ") + what +
                     " before init() finished on this client");
}

PsClient::Handle PsClient::send_each(MessageType type,
                                     const std::vector<std::vector<FloatTensorRef>>& per_server,
                                     const std::vector<std::string>& extra,
                                     const std::vector<bool>& involved) {
  Handle handle;
  handle.client_ = this;
  handle.type_ = type;
  handle.deadline_ = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (!involved[s]) continue;
    const uint64_t id = next_request_id_++;
    Server& server = *servers_[s];
    const auto out =
        transport::encode_float_message(type, id, server.last_version, per_server[s], extra[s]);
    transport::send_message(server.socket, out, nullptr,
                            "parameter server " + server.endpoint + " (" +
                                transport::to_string(type) + ")");
    if (type != MessageType::Push) {
      server.outstanding.insert(id);
      handle.parts_.push_back({s, id});
    }
  }
  return handle;
}

PsClient::Handle PsClient::init(const std::vector<NamedTensor>& tensors) {
  const size_t n = servers_.size();
  std::vector<std::vector<FloatTensorRef>> per_server(n);
  std::vector<std::string> extra(n);
  if (tensors.empty()) return send_each(MessageType::Init, per_server, extra, all_servers());
  std::vector<int64_t> sizes;
  std::string order;
  for (const auto& t : tensors) {
    if (int64_t(t.values.size()) != element_count(t.shape))
      throw InputError("parameter server client: tensor '" + t.name + "' has " +
                       std::to_string(t.values.size()) + " values for its shape");
    sizes.push_back(int64_t(t.values.size()));
    order += t.name + "\n";
  }
  const std::vector<int> placement = place_tensors(sizes, int(n));
  for (size_t i = 0; i < tensors.size(); ++i)
    per_server[size_t(placement[i])].push_back(
        {tensors[i].name, tensors[i].shape, tensors[i].values.data()});
  for (auto& e : extra) e = order;
  // Servers left without a tensor (more servers than tensors) are not asked.
  return send_each(MessageType::Init, per_server, extra, holding(per_server));
}

PsClient::Handle PsClient::pull() {
  require_init("pull()");
  std::vector<std::vector<FloatTensorRef>> none(servers_.size());
  std::vector<bool> holds(servers_.size(), false);
  for (int s : placement_) holds[size_t(s)] = true;  // only servers that hold parameters
  return send_each(MessageType::Pull, none, std::vector<std::string>(servers_.size()), holds);
}

PsClient::Handle PsClient::send_gradients(MessageType type,
                                          const std::vector<NamedTensor>& gradients) {
  require_init(transport::to_string(type));
  std::vector<std::vector<FloatTensorRef>> per_server(servers_.size());
  for (const auto& g : gradients) {
    const auto it = index_.find(g.name);
    if (it == index_.end())
      throw InputError("parameter server client: gradient for unknown parameter '" + g.name + "'");
    if (int64_t(g.values.size()) != element_count(g.shape))
      throw InputError("parameter server client: gradient '" + g.name + "' has " +
                       std::to_string(g.values.size()) + " values for its shape");
    per_server[size_t(placement_[it->second])].push_back({g.name, g.shape, g.values.data()});
  }
  return send_each(type, per_server, std::vector<std::string>(servers_.size()),
                   holding(per_server));
}

PsClient::Handle PsClient::push(const std::vector<NamedTensor>& gradients) {
  return send_gradients(MessageType::Push, gradients);
}

PsClient::Handle PsClient::push_pull(const std::vector<NamedTensor>& gradients) {
  return send_gradients(MessageType::PushPull, gradients);
}

Frames PsClient::await(size_t s, uint64_t request_id, Clock::time_point deadline,
                       MessageType type) {
  Server& server = *servers_[s];
  const std::string where = "parameter server " + server.endpoint;
  for (;;) {
    const auto early = server.early.find(request_id);
    if (early != server.early.end()) {
      Frames frames = std::move(early->second);
      server.early.erase(early);
      server.outstanding.erase(request_id);
      return frames;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      server.outstanding.erase(request_id);  // a late reply is dropped when it comes
      throw TransportError(where + " did not answer " + transport::to_string(type) +
                           " request " + std::to_string(request_id) + " within " +
                           std::to_string(options_.timeout_ms) + " ms");
    }
    Frames frames;
    if (!transport::receive_frames(server.socket, frames, long(left), where)) continue;
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

PsResult PsClient::collect(Handle& handle) {
  PsResult result;
  result.version = UINT64_MAX;
  std::map<std::string, NamedTensor> got;
  std::map<std::string, int> holder;
  std::string order;
  for (const auto& part : handle.parts_) {
    const std::string where = "parameter server " + servers_[part.server]->endpoint;
    const Frames frames = await(part.server, part.request_id, handle.deadline_, handle.type_);
    const DecodeResult r = transport::decode_frames(frames, 0, options_.limits);
    if (!r.ok()) throw TransportError(where + " sent a malformed reply: " + r.error);
    if (r.message.header.type == MessageType::Error)
      throw ServerError(where + ": " + r.message.extra);
    if (r.message.header.type != MessageType::Reply)
      throw TransportError(where + " answered with a " +
                           transport::to_string(r.message.header.type) + ", not a Reply");
    result.version = std::min(result.version, r.message.header.parameter_version);
    Server& server = *servers_[part.server];
    server.last_version = std::max(server.last_version, r.message.header.parameter_version);
    if (handle.type_ == MessageType::PushPull && r.message.extra.rfind("stale", 0) == 0)
      result.stale = true;
    if (handle.type_ == MessageType::Init && order.empty()) order = r.message.extra;
    for (size_t i = 0; i < r.message.tensors.size(); ++i) {
      const auto& info = r.message.tensors[i];
      NamedTensor t{info.name, info.shape, std::vector<float>(size_t(info.bytes / sizeof(float)))};
      std::memcpy(t.values.data(), r.tensor_data[i].data, r.tensor_data[i].size);  // any alignment
      holder[info.name] = int(part.server);
      got[info.name] = std::move(t);
    }
  }
  if (handle.parts_.empty()) result.version = 0;
  if (handle.type_ == MessageType::Init) {
    // Learn the model's order and who holds what (a chief learns it back from its own Init).
    std::vector<std::string> names = split_lines(order);
    if (names.empty())
      for (const auto& kv : holder) names.push_back(kv.first);
    names_.clear();
    placement_.clear();
    index_.clear();
    for (const auto& name : names) {
      const auto it = holder.find(name);
      if (it == holder.end())
        throw ServerError("parameter servers: no server holds parameter '" + name +
                          "' (initialisation incomplete)");
      index_[name] = names_.size();
      names_.push_back(name);
      placement_.push_back(it->second);
    }
  }
  if (!names_.empty() && !got.empty()) {
    for (const auto& name : names_) {
      auto it = got.find(name);
      if (it == got.end()) throw ServerError("parameter servers: reply lacks '" + name + "'");
      result.tensors.push_back(std::move(it->second));
    }
  }
  return result;
}

PsResult PsClient::Handle::wait() {
  if (client_ == nullptr) return {};
  if (waited_) throw InputError("parameter server client: Handle::wait() called twice");
  waited_ = true;
  return client_->collect(*this);
}

std::vector<ServerStats> PsClient::stats() {
  std::vector<std::vector<FloatTensorRef>> none(servers_.size());
  Handle handle = send_each(MessageType::Stats, none, std::vector<std::string>(servers_.size()),
                            all_servers());
  std::vector<ServerStats> out;
  for (const auto& part : handle.parts_) {
    const Frames frames = await(part.server, part.request_id, handle.deadline_, handle.type_);
    const DecodeResult r = transport::decode_frames(frames, 0, options_.limits);
    const std::string where = "parameter server " + servers_[part.server]->endpoint;
    if (!r.ok()) throw TransportError(where + " sent a malformed reply: " + r.error);
    if (r.message.header.type != MessageType::Reply)
      throw ServerError(where + ": " + r.message.extra);
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
