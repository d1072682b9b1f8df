// Protocol messages over ZeroMQ sockets: one message = one multipart ZeroMQ message (a ROUTER
// prefixes the peer's routing-id frame). The codec (wire_protocol.h) knows nothing of sockets;
// this file knows nothing of parameters.
#pragma once

#include <sys/types.h>
#include <zmq.hpp>

#include <string>
#include <utility>
#include <vector>

#include "send_hold.h"
#include "tandem/error.h"
#include "wire_protocol.h"

namespace tandem::transport {

// A socket failed or a peer did not answer in time. The text names the endpoint and the
// operation. (tandem::Error derives from std::runtime_error.)
class TransportError : public Error {
 public:
  using Error::Error;
};

using Frames = std::vector<zmq::message_t>;

// Sends `message` (header frame, then tensor frames), preceded by `routing_id` when given (a
// ROUTER addressing a peer). Without `hold` every frame is COPIED into a ZeroMQ message, so the
// caller may change the tensors as soon as this returns. With `hold`, tensor frames of at least
// kZeroCopyMinBytes are sent zero-copy (send_hold.h): each counts on `hold` until ZeroMQ lets go
// of it, and the caller must leave their bytes alone while hold->in_use(). Smaller frames and
// the header frame are always copied (ZeroMQ keeps frames under 34 bytes inside the message, and
// a copy of a few KiB costs less than the free callback's bookkeeping).
// Throws TransportError naming `where` when ZeroMQ fails or the send would block (send timeout
// or high-water mark: the send is abandoned, never half a message: ZeroMQ queues multipart
// messages atomically; frames not sent are let go at once).
constexpr size_t kZeroCopyMinBytes = 4096;
void send_message(zmq::socket_t& socket, const OutgoingMessage& message,
                  const zmq::message_t* routing_id, const std::string& where,
                  const std::shared_ptr<SendHold>& hold = nullptr);

// The same for raw frames (tests use it to send malformed messages).
void send_frames(zmq::socket_t& socket, const std::vector<ByteSpan>& frames,
                 const zmq::message_t* routing_id, const std::string& where);

// A server's socket drops a connection whose peer has said nothing, not even ZeroMQ's own
// heartbeat answer, for kSilentPeerTimeoutMs: a peer host that lost power or its network never
// closes its TCP connection, and each such connection held a file descriptor and a pipe in the
// server for the rest of its life. ZeroMQ answers the heartbeats on its I/O thread, so a peer
// busy in a long step, or slowed by a sanitizer, still answers. bind_checked sets them.
constexpr int kHeartbeatIntervalMs = 5000;
constexpr int kSilentPeerTimeoutMs = 60000;

// Binds `socket` to `address` and returns the endpoint bound (last_endpoint: the port ZeroMQ
// chose for "*" or 0). The one way the servers bind: an address bind_address_problem refuses
// (ZeroMQ takes a tcp:// port modulo 65536) is an InputError "REFUSAL: why", one ZeroMQ cannot
// bind (in use, no such interface) a TransportError "REFUSAL to ADDRESS: ZeroMQ's reason".
// Before binding, it makes the socket drop silent peers (the heartbeat options above).
std::string bind_checked(zmq::socket_t& socket, const std::string& address,
                         const std::string& refusal);

// libzmq (4.3) leaves the file of an ipc:// path it bound when its socket closes (it removes only
// those of "ipc://*", which it made itself), so each stopped server left a socket file in the
// user's directory, and a stopped run one per address. Made with the address given to
// bind_checked once the bind succeeded, this removes that file when destroyed (or at remove()),
// as long as it is still the file this bind made: another server may have bound the path since.
// Nothing for other transports, "ipc://*" and abstract names ("ipc://@...").
class BoundIpcFile {
 public:
  BoundIpcFile() = default;
  explicit BoundIpcFile(const std::string& address);
  BoundIpcFile(BoundIpcFile&& other) noexcept { *this = std::move(other); }
  BoundIpcFile& operator=(BoundIpcFile&& other) noexcept;
  ~BoundIpcFile() { remove(); }
  void remove() noexcept;

 private:
  std::string path_;  // empty: nothing to remove
  dev_t device_ = 0;
  ino_t inode_ = 0;
};

// Receives one whole multipart message if one arrives within timeout_ms (0: only if one is
// waiting). Returns false on timeout. TransportError naming `where` when ZeroMQ fails.
bool receive_frames(zmq::socket_t& socket, Frames& out, long timeout_ms, const std::string& where);

// Decodes frames[first..] (first = 1 behind a ROUTER's routing-id frame). The result's spans
// point into `frames`, which must stay alive and unmoved (small ZeroMQ messages hold their bytes
// inline, so moving the vector's elements would move the bytes).
DecodeResult decode_frames(const Frames& frames, size_t first, const DecodeLimits& limits);

}  // namespace tandem::transport
