// The client side of CURVE (zmq_curve.h has the keys and the server's ZAP handler): the keys one
// client socket needs, put on it before it connects, and a watch on its handshakes, so that a
// request that gets no answer can say why when a CURVE server refused it. Shared by every client
// of Tandem's CURVE servers: parameter-server clients, the roles' line to the coordinator, the
// scores channel's subscribers.
#pragma once

#include <zmq.hpp>

#include <string>

#include "zmq_curve.h"

namespace tandem::transport {

// A CURVE client's keys: the server's public key (Z85) and this client's own pair.
// server_public empty: no CURVE (the pair must be empty too).
struct CurveClientKeys {
  std::string server_public;
  CurveKeyPair client;  // secret_key empty: a throwaway pair (only servers that admit any key)

  bool enabled() const { return !server_public.empty(); }
};

// The keys made ready for use: each validated (TransportError naming `where` and the key), a
// throwaway pair made when no secret key is given, the public key derived from the secret one
// (InputError when a given public key does not belong to it, or a client pair comes without a
// server key).
CurveClientKeys resolve_curve_client(CurveClientKeys keys, const std::string& where);

// The keys of a client that knows the server's public key (Z85; empty: no CURVE) and has its
// own pair in `client_key_file` (a .key_secret file; empty: none, a throwaway pair is made when
// the keys are resolved). Checked (errors name `where`), not resolved: whoever resolves them
// can still tell a given pair from none.
CurveClientKeys curve_client_keys(const std::string& server_public,
                                  const std::string& client_key_file, const std::string& where);

// Makes `socket` a CURVE client with resolved `keys`; nothing when they are not enabled. Call
// before connect: the handshake starts there.
void set_curve_client(zmq::socket_t& socket, const CurveClientKeys& keys);

// Makes `socket` a CURVE server with `secret_key` whose connections ZAP checks in `zap_domain`
// (a ZapAuthenticator registration on the socket's context). Call before bind.
void set_curve_server(zmq::socket_t& socket, const std::string& secret_key,
                      const std::string& zap_domain);

// Reads a client socket's handshake events (ZeroMQ's socket monitor, on a PAIR socket of the
// same context) and keeps the latest failure's explanation. A plain client (no key) is watched
// too: its handshake with a CURVE server fails, and the explanation says so. It holds the
// socket's handle: declare it after the socket, so that it closes first, and reset it (assign an
// empty watch) before closing the socket any other way. Closing stops the socket's monitor
// before the PAIR that reads it (libzmq's I/O thread sends each event blocking, and a monitor
// whose reader is gone would stop that thread, and with it every socket of the context, for
// good). Not thread-safe: use it from the thread that owns the socket.
class CurveHandshakeWatch {
 public:
  // How long a caller that has just seen its request go unanswered waits for the handshake's
  // event: the I/O thread reports a refusal within milliseconds of dropping the connection.
  static constexpr int kEventWaitMs = 200;

  CurveHandshakeWatch() = default;  // watches nothing: problem() is always ""
  // Starts watching `socket` (before it connects). `client_public_key` is named in the message
  // of a refused key; empty for a plain client.
  CurveHandshakeWatch(zmq::context_t& context, zmq::socket_t& socket, std::string client_public_key);
  ~CurveHandshakeWatch();
  CurveHandshakeWatch(CurveHandshakeWatch&& other) noexcept;
  CurveHandshakeWatch& operator=(CurveHandshakeWatch&& other) noexcept;

  // The latest failed handshake's explanation ("CURVE authentication failed: the server refused
  // this client's key ..."), after reading the events queued so far; "" when none failed since
  // the last success. With wait_ms > 0 and nothing known yet, waits up to that long for an
  // event: the socket may drop a refused connection before its event reaches the watch.
  const std::string& problem(int wait_ms = 0);

 private:
  void stop();  // the socket's monitor, then the PAIR reading it

  void* watched_ = nullptr;  // the socket's handle, while its monitor runs
  zmq::socket_t monitor_;
  std::string client_public_key_;
  std::string problem_;
};

}  // namespace tandem::transport
