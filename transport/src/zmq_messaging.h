// Protocol messages over ZeroMQ sockets: one message = one multipart ZeroMQ message (a ROUTER
// prefixes the peer's routing-id frame). The codec (wire_protocol.h) knows nothing of sockets;
// this file knows nothing of parameters.
#pragma once

#include <zmq.hpp>

#include <string>
#include <vector>

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
// ROUTER addressing a peer). Every frame is COPIED into a ZeroMQ message: ZeroMQ may keep a
// zero-copy buffer past send() (an inproc receiver holds the sender's very buffer until it drops
// the message), and the server's parameters change under a queued reply, so a copy is the only
// lifetime that is always right. Zero-copy with an owned snapshot can come with the benchmarks.
// Throws TransportError naming `where` when ZeroMQ fails or the send would block (send timeout
// or high-water mark: the send is abandoned, never half a message: ZeroMQ queues multipart
// messages atomically).
void send_message(zmq::socket_t& socket, const OutgoingMessage& message,
                  const zmq::message_t* routing_id, const std::string& where);

// The same for raw frames (tests use it to send malformed messages).
void send_frames(zmq::socket_t& socket, const std::vector<ByteSpan>& frames,
                 const zmq::message_t* routing_id, const std::string& where);

// Receives one whole multipart message if one arrives within timeout_ms (0: only if one is
// waiting). Returns false on timeout. TransportError naming `where` when ZeroMQ fails.
bool receive_frames(zmq::socket_t& socket, Frames& out, long timeout_ms, const std::string& where);

// Decodes frames[first..] (first = 1 behind a ROUTER's routing-id frame). The result's spans
// point into `frames`, which must stay alive and unmoved (small ZeroMQ messages hold their bytes
// inline, so moving the vector's elements would move the bytes).
DecodeResult decode_frames(const Frames& frames, size_t first, const DecodeLimits& limits);

}  // namespace tandem::transport
