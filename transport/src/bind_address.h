// What is wrong with a ZeroMQ address to bind, before ZeroMQ sees it: ZeroMQ takes a tcp://
// port modulo 65536 (tcp://127.0.0.1:99999 served on 34463), so a mistyped port would be
// served, and advertised, somewhere else.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
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

// Whether `host` (a name or an address, as a bind or a Host header gives it, IPv6 without its
// brackets) is this machine's loopback: localhost, 127.x.y.z, ::1; any case, a trailing dot.
inline bool is_loopback_host(std::string host) {
  for (char& c : host) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (!host.empty() && host.back() == '.') host.pop_back();  // the fully qualified form
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// Whether a socket bound to `address` can be reached from this machine only: ipc:// and
// inproc://, or tcp:// on a loopback host (is_loopback_host; IPv6 in brackets). Every other
// address (tcp://0.0.0.0:*, a host's name or its address on a network) serves other machines.
inline bool binds_this_machine_only(const std::string& address) {
  if (address.rfind("ipc://", 0) == 0 || address.rfind("inproc://", 0) == 0) return true;
  if (address.rfind("tcp://", 0) != 0) return false;
  const size_t colon = address.find_last_of(':');
  std::string host = colon < 6 ? std::string() : address.substr(6, colon - 6);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return is_loopback_host(host);
}

}  // namespace tandem::transport
