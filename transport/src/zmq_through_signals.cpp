#include "zmq_through_signals.h"

#include <cerrno>

namespace tandem::transport {

namespace {

// Calls f() until it ends without EINTR.
template <typename F>
auto again_after_signals(F&& f) {
  for (;;) {
    try {
      return f();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

}  // namespace

int poll_through_signals(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (timeout.count() < 0)
    return again_after_signals([&] { return zmq::poll(items, count, timeout); });
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
  return again_after_signals([&] { return socket.send(message, flags); });
}

zmq::send_result_t send_through_signals(zmq::socket_t& socket, zmq::const_buffer buffer,
                                        zmq::send_flags flags) {
  return again_after_signals([&] { return socket.send(buffer, flags); });
}

zmq::recv_result_t recv_through_signals(zmq::socket_t& socket, zmq::message_t& message,
                                        zmq::recv_flags flags) {
  return again_after_signals([&] { return socket.recv(message, flags); });
}

}  // namespace tandem::transport
