#include "zmq_messaging.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

#include "bind_address.h"
#include "zmq_through_signals.h"

namespace tandem::transport {
namespace {

// ZeroMQ hands a message's buffer from the sending thread to the receiving one through its own
// lock-free queues. Debian's libzmq is not built with ThreadSanitizer, so that hand-off is
// invisible to it; these annotations state it (release when a message is filled, acquire when
// one arrives), so TSan checks our own threads without reporting every message as a race.
inline void message_handed_over(const zmq::message_t& part) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(part.data()));
#else
  (void)part;
#endif
}

inline void message_taken_over(const zmq::message_t& part) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(part.data()));
#else
  (void)part;
#endif
}

[[noreturn]] void fail(const std::string& where, const char* op, const zmq::error_t& e) {
  throw TransportError(where + ": ZeroMQ " + op + " failed: " + e.what());
}

// ZeroMQ's free callback for a zero-copy frame: `hint` is the frame's own reference to its hold.
void let_go(void* /*data*/, void* hint) {
  auto* hold = static_cast<std::shared_ptr<SendHold>*>(hint);
  SendHoldCount::remove(**hold);
  delete hold;
}

zmq::message_t zero_copy_frame(const ByteSpan& f, const std::shared_ptr<SendHold>& hold) {
  auto hint = std::make_unique<std::shared_ptr<SendHold>>(hold);
  SendHoldCount::add(*hold);
  try {
    // ZeroMQ only reads the bytes; its API takes them as non-const.
    zmq::message_t part(const_cast<uint8_t*>(f.data), f.size, &let_go, hint.get());
    hint.release();  // the message owns it now: let_go deletes it
    return part;
  } catch (...) {
    SendHoldCount::remove(*hold);
    throw;
  }
}

// frames[0] is the header frame, always copied; with `hold`, large tensor frames are not.
void send_all(zmq::socket_t& socket, const std::vector<ByteSpan>& frames,
              const zmq::message_t* routing_id, const std::string& where,
              const std::shared_ptr<SendHold>& hold) {
  std::vector<zmq::message_t> parts;
  parts.reserve(frames.size() + 1);
  if (routing_id != nullptr) parts.emplace_back(routing_id->data(), routing_id->size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const ByteSpan& f = frames[i];
    if (hold && i > 0 && f.size >= kZeroCopyMinBytes)
      parts.push_back(zero_copy_frame(f, hold));
    else
      parts.emplace_back(f.data, f.size);
  }
  for (const zmq::message_t& part : parts) message_handed_over(part);
  try {
    for (size_t i = 0; i < parts.size(); ++i) {
      const bool last = i + 1 == parts.size();
      // Only the first frame can block (later frames of a started message always queue), so a
      // timeout never leaves half a message behind.
      const auto sent = send_through_signals(
          socket, parts[i], last ? zmq::send_flags::none : zmq::send_flags::sndmore);
      if (!sent) throw TransportError(where + ": send timed out (peer not reading, queue full)");
    }
  } catch (const zmq::error_t& e) {
    fail(where, "send", e);
  }
}

}  // namespace

void send_message(zmq::socket_t& socket, const OutgoingMessage& message,
                  const zmq::message_t* routing_id, const std::string& where,
                  const std::shared_ptr<SendHold>& hold) {
  send_all(socket, message.frames(), routing_id, where, hold);
}

void send_frames(zmq::socket_t& socket, const std::vector<ByteSpan>& frames,
                 const zmq::message_t* routing_id, const std::string& where) {
  send_all(socket, frames, routing_id, where, nullptr);
}

bool receive_frames(zmq::socket_t& socket, Frames& out, long timeout_ms, const std::string& where) {
  out.clear();
  try {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    if (poll_through_signals(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) return false;
    if ((item.revents & ZMQ_POLLIN) == 0) return false;
    // ZeroMQ delivers a multipart message whole, so once the first part is here the rest is too.
    do {
      zmq::message_t part;
      if (!recv_through_signals(socket, part, zmq::recv_flags::dontwait)) {
        if (out.empty()) return false;  // a spurious wake-up
        throw TransportError(where + ": multipart message ended early");
      }
      message_taken_over(part);
      out.push_back(std::move(part));
    } while (out.back().more());
  } catch (const zmq::error_t& e) {
    fail(where, "receive", e);
  }
  return true;
}

DecodeResult decode_frames(const Frames& frames, size_t first, const DecodeLimits& limits) {
  std::vector<ByteSpan> spans;
  spans.reserve(frames.size());
  for (size_t i = first; i < frames.size(); ++i)
    spans.push_back({static_cast<const uint8_t*>(frames[i].data()), frames[i].size()});
  return decode(spans, limits);
}

namespace {

// libzmq removes the file at an ipc:// path before it binds there, so a second server given a
// live server's path took the address from under it, silently (a tcp:// port in use is refused).
// A path a process answers at is refused as in use; a file left by a process gone (nothing
// answers) is replaced as before. (Not atomic: two servers binding the same path at the same
// instant can still both pass; the case is one started at a path already served.)
bool ipc_path_answers(const sockaddr_un& where) {
  // Non-blocking: a hung server whose backlog is full makes connect() wait, not answer.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;  // cannot tell: bind as before
  int rc;
  do rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&where), sizeof(where));
  while (rc != 0 && errno == EINTR);
  const bool answers = rc == 0 || errno == EAGAIN || errno == EINPROGRESS;
  ::close(fd);
  return answers;
}

void refuse_served_ipc_path(const std::string& address, const std::string& refusal) {
  if (address.rfind("ipc://", 0) != 0) return;
  const std::string path = address.substr(6);
  sockaddr_un where{};
  if (path.empty() || path == "*" || path[0] == '@' || path.size() >= sizeof(where.sun_path))
    return;  // any path, an abstract name (in use is refused), or too long (zmq refuses it)
  where.sun_family = AF_UNIX;
  std::memcpy(where.sun_path, path.c_str(), path.size() + 1);
  // A server that has just closed at this path (in this process, or one ending) may answer a
  // little longer: ZeroMQ closes a listener on its own thread, after the socket is closed.
  // Only a path that still answers a second later is in use.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (ipc_path_answers(where)) {
    if (std::chrono::steady_clock::now() > give_up)
      throw TransportError(refusal + " to " + address + ": a server is listening at " + path +
                           " (the address is in use; give this one another path)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string bind_checked(zmq::socket_t& socket, const std::string& address,
                         const std::string& refusal) {
  const std::string problem = bind_address_problem(address);
  if (!problem.empty()) throw InputError(refusal + ": " + problem);
  refuse_served_ipc_path(address, refusal);
  try {
    // Before bind: the options apply to connections accepted from then on.
    socket.set(zmq::sockopt::heartbeat_ivl, kHeartbeatIntervalMs);
    socket.set(zmq::sockopt::heartbeat_timeout, kSilentPeerTimeoutMs);
    socket.bind(address);
  } catch (const zmq::error_t& e) {
    throw TransportError(refusal + " to " + address + ": " + e.what());
  }
  return socket.get(zmq::sockopt::last_endpoint);
}

BoundIpcFile::BoundIpcFile(const std::string& address) {
  if (address.rfind("ipc://", 0) != 0) return;
  const std::string path = address.substr(6);
  // (libzmq removes the temporary directory of "ipc://*" itself, only when the file is there.)
  if (path.empty() || path == "*" || path[0] == '@') return;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  // Absolute: bound relative to the working directory of now, which a program may change.
  std::error_code ec;
  path_ = std::filesystem::absolute(path, ec).string();
  if (ec) path_.clear();
  device_ = st.st_dev;
  inode_ = st.st_ino;
}

BoundIpcFile& BoundIpcFile::operator=(BoundIpcFile&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::move(other.path_);
    device_ = other.device_;
    inode_ = other.inode_;
    other.path_.clear();
  }
  return *this;
}

void BoundIpcFile::remove() noexcept {
  if (path_.empty()) return;
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == device_ &&
      st.st_ino == inode_)
    ::unlink(path_.c_str());
  path_.clear();
}

}  // namespace tandem::transport
