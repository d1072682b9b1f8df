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

}  // namespace tandem::transport
