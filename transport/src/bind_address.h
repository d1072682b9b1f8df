// What is wrong with a ZeroMQ address to bind, before ZeroMQ sees it: ZeroMQ takes a tcp://
// port modulo 65536 (tcp://127.0.0.1:99999 served on 34463), so a mistyped port would be
// served, and advertised, somewhere else.
#pragma once

#include <string>

namespace tandem::transport {

// "" for an address to bind as given; otherwise why not. A tcp:// address needs a port: "*" or
// 0 to 65535. Other transports (ipc://, inproc://) are ZeroMQ's to judge.
inline std::string bind_address_problem(const std::string& address) {
  if (address.rfind("tcp://", 0) != 0) return {};
  const size_t colon = address.find_last_of(':');
  const std::string port = colon < 6 ? std::string() : address.substr(colon + 1);
  if (port == "*") return {};
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == std::string::npos;
  if (digits && std::stol(port) <= 65535) return {};
  return "a tcp:// address needs a port from 0 to 65535 or *, got '" + address + "'";
}

// Whether a socket bound to `address` can be reached from this machine only: ipc:// and
// inproc://, or tcp:// on a loopback address or name (127.x.y.z, localhost, [::1]). Every other
// address (tcp://0.0.0.0:*, a host's name or its address on a network) serves other machines.
inline bool binds_this_machine_only(const std::string& address) {
  if (address.rfind("ipc://", 0) == 0 || address.rfind("inproc://", 0) == 0) return true;
  if (address.rfind("tcp://", 0) != 0) return false;
  const size_t colon = address.find_last_of(':');
  const std::string host = colon < 6 ? std::string() : address.substr(6, colon - 6);
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
}

}  // namespace tandem::transport
