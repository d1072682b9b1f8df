// ZeroMQ CURVE security for the parameter server: key pairs, key files, and the ZAP handler that
// decides which clients a CURVE server admits. CURVE (RFC 26) authenticates the server to every
// client (a client must know the server's public key) and encrypts every frame; which CLIENT keys
// are admitted is not CURVE's business but ZAP's (RFC 27): libzmq asks a handler bound at
// "inproc://zeromq.zap.01" in the server socket's context, once per connection. Note that libzmq
// applies no security mechanism to inproc:// endpoints at all.
//
// Keys travel as Z85 text (40 characters for 32 bytes), as ZeroMQ's own tools print them.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zmq_messaging.h"

namespace tandem::transport {

// A CURVE key pair in Z85. secret_key is empty when only the public half is known.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

// TransportError unless this libzmq was built with CURVE (zmq_has("curve")).
void require_curve();

// A fresh random key pair (zmq_curve_keypair).
CurveKeyPair generate_curve_keypair();

// The public key that belongs to a Z85 secret key (zmq_curve_public). Validates `secret` first.
std::string curve_public_from_secret(const std::string& secret);

// TransportError naming `what` (e.g. "curve_secret_key") unless `key` is 40 Z85 characters that
// decode to 32 bytes.
void validate_curve_key(const std::string& key, const std::string& what);

// The 32 raw bytes of a Z85 key (validated, naming `what`).
std::string curve_key_bytes(const std::string& key, const std::string& what);

// Key files, in the text format of ZeroMQ's zcert (czmq), which also reads them:
//   # comments
//   curve
//       public-key = "<40 Z85 chars>"
//       secret-key = "<40 Z85 chars>"
// write_curve_key_files writes PREFIX.key (public key only: give it to the other side) and
// PREFIX.key_secret (both keys; created with mode 0600, and set to 0600 if it existed). IoError
// when a file cannot be written; InputError, before anything is written, when either file (or a
// link by its name) exists and replace_existing is false: a new pair under an old name locks out
// every peer holding the old public key, and the old secret is gone for good.
void write_curve_key_files(const std::string& path_prefix, const CurveKeyPair& pair,
                           bool replace_existing = false);

// Reads either kind of key file: secret_key stays empty for a public one. Section names
// ("curve", "metadata") and other "name = value" lines are ignored; a secret key must match the
// public key. IoError when the file cannot be read, TransportError naming the file (and line)
// when its content is wrong.
CurveKeyPair read_curve_key_file(const std::string& path);
// The same for a file that must hold the secret key (a server's, or a client's own): InputError
// naming the file when it is a public key file.
CurveKeyPair read_curve_secret_key_file(const std::string& path);

// The client keys a server admits, from `path`: a directory (every *.key file in it, by name,
// read as above), one key file (its public key), or a file with one Z85 public key per line
// (blank lines and '#' comments skipped). TransportError naming the file and line for a bad key,
// and when the list is empty: an empty allowed list would admit every key holder, which a list
// file never means.
std::vector<std::string> read_curve_allowed_clients(const std::string& path);

// The ZAP handler of one ZeroMQ context. libzmq lets only one handler bind per context, while
// several CURVE servers may share a context (tests, one process hosting several shards), each with
// its own admitted keys; so there is one handler per context, shared through a process-wide
// registry keyed by the context, and each server registers its own ZAP domain (the server socket's
// ZMQ_ZAP_DOMAIN) with its own key set. The handler's thread starts with the first registration on
// a context and stops (sockets closed, linger 0) when the last is released: release every
// registration before destroying the context, as zmq_ctx_term waits for the handler's sockets.
//
// Each request is answered 200 when its domain is registered, its mechanism is CURVE and the
// client's key is in the domain's set (or the set is empty: any client that knows the server's
// public key), else 400. A rejected key is counted, and logged to stderr once per key and
// domain, for the first 100 keys of a domain (the rest only counted).
class ZapAuthenticator {
 public:
  // One domain's place in its context's handler; releasing it (destructor, move-assignment)
  // unregisters the domain. Move-only.
  class Registration {
   public:
    Registration() = default;
    ~Registration();
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

    const std::string& domain() const { return domain_; }
    // Connections refused so far (key not admitted, or not CURVE).
    int64_t rejected() const { return rejected_ ? rejected_->load() : 0; }

   private:
    friend class ZapAuthenticator;
    void release();
    void* context_ = nullptr;
    std::string domain_;
    std::shared_ptr<std::atomic<int64_t>> rejected_;
  };

  // Admits `allowed_public_keys` (Z85; empty: any key holder) to `domain` on `context`, starting
  // the context's handler if needed. TransportError for a bad key, a domain already registered
  // on this context, or when the handler's address is taken (something else serves ZAP there).
  static Registration allow(zmq::context_t& context, const std::string& domain,
                            const std::vector<std::string>& allowed_public_keys);

  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

 private:
  struct State;
  explicit ZapAuthenticator(zmq::context_t& context);
  void serve();
  std::unique_ptr<State> state_;
};

}  // namespace tandem::transport
