// transport::bind_checked, the one way every server binds, and BoundIpcFile, which removes the
// ipc:// file a bind left.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "test_support.h"
#include "zmq_messaging.h"

namespace tandem::transport {
namespace {

TEST(ZmqMessaging, BindCheckedReturnsThePortChosenAndDropsSilentPeers) {
  zmq::context_t context;
  zmq::socket_t socket(context, zmq::socket_type::router);
  const std::string bound = bind_checked(socket, "tcp://127.0.0.1:*", "test: cannot bind");
  ASSERT_EQ(bound.rfind("tcp://127.0.0.1:", 0), 0u) << bound;
  EXPECT_NE(bound, "tcp://127.0.0.1:*");
  EXPECT_GT(std::stoi(bound.substr(bound.rfind(':') + 1)), 0) << bound;
  // Set on every server's socket: a peer host that vanished is dropped, not held for ever.
  EXPECT_EQ(socket.get(zmq::sockopt::heartbeat_ivl), kHeartbeatIntervalMs);
  EXPECT_EQ(socket.get(zmq::sockopt::heartbeat_timeout), kSilentPeerTimeoutMs);
}

TEST(ZmqMessaging, BindCheckedRefusesAPortZeroMqWouldWrap) {
  zmq::context_t context;
  zmq::socket_t socket(context, zmq::socket_type::router);
  try {
    bind_checked(socket, "tcp://127.0.0.1:99999", "test: cannot bind");
    FAIL() << "a port above 65535 was bound";
  } catch (const TransportError& e) {
    FAIL() << "an address error is the caller's input, not the transport's: " << e.what();
  } catch (const InputError& e) {
    EXPECT_TRUE(test::contains(e.what(), "test: cannot bind: a tcp:// address needs a port"))
        << e.what();
  }
}

TEST(ZmqMessaging, BindCheckedNamesTheAddressInUse) {
  zmq::context_t context;
  zmq::socket_t first(context, zmq::socket_type::router);
  zmq::socket_t second(context, zmq::socket_type::router);
  const std::string bound = bind_checked(first, "tcp://127.0.0.1:*", "first: cannot bind");
  try {
    bind_checked(second, bound, "second: cannot bind");
    FAIL() << "two sockets bound " << bound;
  } catch (const TransportError& e) {
    EXPECT_TRUE(test::contains(e.what(), "second: cannot bind to " + bound + ": ")) << e.what();
  }
}

TEST(ZmqMessaging, BoundIpcFileRemovesTheFileItsBindMadeOnly) {
  test::TempDir dir;
  const std::string path = dir.file("server.ipc");
  zmq::context_t context;
  {
    zmq::socket_t socket(context, zmq::socket_type::router);
    bind_checked(socket, "ipc://" + path, "test: cannot bind");
    const BoundIpcFile file("ipc://" + path);
    ASSERT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "the socket file outlived its server";

  // Another server bound the path since: its file is not this object's to remove.
  BoundIpcFile stale;
  {
    zmq::socket_t socket(context, zmq::socket_type::router);
    bind_checked(socket, "ipc://" + path, "test: cannot bind");
    stale = BoundIpcFile("ipc://" + path);
  }
  // Kept under another name, the old file keeps its inode: the new one cannot reuse it.
  std::filesystem::rename(path, path + ".old");
  zmq::socket_t later(context, zmq::socket_type::router);
  bind_checked(later, "ipc://" + path, "test: cannot bind");
  stale.remove();
  EXPECT_TRUE(std::filesystem::exists(path)) << "removed the file of a server bound since";
}

}  // namespace
}  // namespace tandem::transport
