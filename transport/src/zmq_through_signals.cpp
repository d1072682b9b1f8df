#include "zmq_through_signals.h"

#include <cerrno>

namespace tandem::transport {

namespace {

using Clock = std::chrono::steady_clock;

// Calls f() until it ends without EINTR. With a time limit (`limit_ms()`: a socket's SNDTIMEO
// or RCVTIMEO, -1 for none, asked only once a signal came), a call interrupted once that limit
// has passed since the first try has timed out (an empty result, as EAGAIN). Each retry waits up
// to the whole limit again, so a call takes at most twice it; without the bound, signals coming
// faster than the limit (a profiler's timer) kept it from ever timing out. A call that does not
// wait (dontwait, or a limit of 0) is retried at once: libzmq's check of its command queue can
// meet a signal even there, and an empty result in the middle of a message of several frames
// would leave half of it in the socket.
template <typename F, typename Limit>
auto again_within_limit(F&& f, Limit&& limit_ms) -> decltype(f()) {
  const Clock::time_point start = Clock::now();
  int limit = -2;  // not asked yet
  for (;;) {
    try {
      return f();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
      if (limit == -2) limit = limit_ms();
      if (limit > 0 && Clock::now() - start >= std::chrono::milliseconds(limit)) return {};
    }
  }
}

// The socket's limit for a call with `dontwait` (none: it does not wait) or without it.
int send_limit_ms(zmq::socket_t& socket, bool dontwait) {
  return dontwait ? 0 : socket.get(zmq::sockopt::sndtimeo);
}
int recv_limit_ms(zmq::socket_t& socket, bool dontwait) {
  return dontwait ? 0 : socket.get(zmq::sockopt::rcvtimeo);
}

}  // namespace

int poll_through_signals(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (timeout.count() < 0)
    return again_within_limit([&] { return zmq::poll(items, count, timeout); },
                              [] { return -1; });
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    try {
      return zmq::poll(items, count, left);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
      if (left.count() == 0) return 0;  // interrupted at the deadline: timed out
    }
  }
}

zmq::send_result_t send_through_signals(zmq::socket_t& socket, zmq::message_t& message,
                                        zmq::send_flags flags) {
  const bool dontwait = (flags & zmq::send_flags::dontwait) == zmq::send_flags::dontwait;
  return again_within_limit([&] { return socket.send(message, flags); },
                            [&] { return send_limit_ms(socket, dontwait); });
}

zmq::send_result_t send_through_signals(zmq::socket_t& socket, zmq::const_buffer buffer,
                                        zmq::send_flags flags) {
  const bool dontwait = (flags & zmq::send_flags::dontwait) == zmq::send_flags::dontwait;
  return again_within_limit([&] { return socket.send(buffer, flags); },
                            [&] { return send_limit_ms(socket, dontwait); });
}

zmq::recv_result_t recv_through_signals(zmq::socket_t& socket, zmq::message_t& message,
                                        zmq::recv_flags flags) {
  const bool dontwait = (flags & zmq::recv_flags::dontwait) == zmq::recv_flags::dontwait;
  return again_within_limit([&] { return socket.recv(message, flags); },
                            [&] { return recv_limit_ms(socket, dontwait); });
}

}  // namespace tandem::transport
