// ZeroMQ calls that go on through signals. A signal whose handler runs on the calling thread
// (the stop handler for Ctrl-C or a closed terminal, which the kernel may deliver to any thread
// of the process; a profiler's timer) makes zmq_poll, and zmq_msg_send / zmq_msg_recv while they
// process the socket's pending commands, fail with EINTR, which cppzmq throws as zmq::error_t.
// A serving thread that let it escape ended the process (std::terminate); a wait or a send that
// let it escape lost an answer. These call again instead: for poll, for the time that is left;
// for send and receive, at once (EINTR comes before anything is queued or taken, so the message
// is untouched and the retry is exact), until the socket's SNDTIMEO or RCVTIMEO has passed since
// the first call: interrupted after that, the call has timed out (at most twice the limit).
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstddef>

namespace tandem::transport {

// As zmq::poll: the number of items with events, 0 when `timeout` passed first (negative: wait
// without limit). Other ZeroMQ errors are thrown as zmq::poll throws them.
int poll_through_signals(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout);

// As socket.send / socket.recv (an empty result: EAGAIN, as there); other errors are thrown.
zmq::send_result_t send_through_signals(zmq::socket_t& socket, zmq::message_t& message,
                                        zmq::send_flags flags);
zmq::send_result_t send_through_signals(zmq::socket_t& socket, zmq::const_buffer buffer,
                                        zmq::send_flags flags);
zmq::recv_result_t recv_through_signals(zmq::socket_t& socket, zmq::message_t& message,
                                        zmq::recv_flags flags);

}  // namespace tandem::transport
