#include "dashboard_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "bind_address.h"
#include "tandem/error.h"

namespace tandem {
namespace {

#include "dashboard_page.inc"

// SO_REUSEADDR only: a restarted coordinator can take its port back from TIME_WAIT at once, but a
// second live server cannot share it. (httplib's default adds SO_REUSEPORT, which would let two
// dashboards bind one port and split its connections between them.)
void reuse_address_only(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// httplib reports a failed bind as false or -1 with no reason; repeat the resolve and bind here to
// find it ("Address already in use", "Cannot assign requested address", a resolver message).
std::string bind_failure_reason(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return std::string("cannot resolve host: ") + gai_strerror(rc);
  std::string reason = "unknown reason (a plain bind there succeeds now)";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int sock = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (sock < 0) {
      reason = std::strerror(errno);
      continue;
    }
    reuse_address_only(sock);
    const bool bound = bind(sock, a->ai_addr, a->ai_addrlen) == 0 && listen(sock, 1) == 0;
    if (!bound) reason = std::strerror(errno);
    close(sock);
    if (!bound) break;
  }
  freeaddrinfo(found);
  return reason;
}

std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// Runs a callback, turning an exception into a 500 whose body says what went wrong.
template <typename F>
void respond(httplib::Response& res, const char* what, const char* content_type, F&& body) {
  try {
    res.set_content(body(), content_type);
  } catch (const std::exception& e) {
    res.status = 500;
    res.set_content(std::string(what) + " failed: " + e.what() + "\n", "text/plain");
  } catch (...) {
    res.status = 500;
    res.set_content(std::string(what) + " failed\n", "text/plain");
  }
  res.set_header("Cache-Control", "no-store");
}

// The host part of a Host header ("127.0.0.1:8787", "[::1]:8787", "localhost").
std::string host_of_header(const std::string& header) {
  if (!header.empty() && header[0] == '[') {
    const size_t close = header.find(']');
    return close == std::string::npos ? header : header.substr(1, close - 1);
  }
  return header.substr(0, header.find(':'));
}

// What a request may be before any route sees it, and before its body is read: GET or HEAD (the
// dashboard reads nothing from its clients; httplib would read a chunked body of any size into
// memory), and, on a loopback server, addressed to a loopback name: a web page the user opens
// can send requests to 127.0.0.1, and one under a name of its own that it resolves to
// 127.0.0.1 (DNS rebinding) would otherwise read the cluster's state.
httplib::Server::HandlerResponse screen(const DashboardOptions& options,
                                        const httplib::Request& req, httplib::Response& res) {
  if (req.method != "GET" && req.method != "HEAD") {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_header("Connection", "close");  // the body stays unread
    res.set_content("the dashboard answers GET and HEAD only\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  }
  if (transport::is_loopback_host(options.host) && req.has_header("Host") &&
      !transport::is_loopback_host(host_of_header(req.get_header_value("Host")))) {
    res.status = 403;
    res.set_content("this dashboard serves loopback names only (localhost, 127.0.0.1, [::1])\n",
                    "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

}  // namespace

struct DashboardServer::Impl {
  DashboardOptions options;
  std::function<std::string()> state, metrics;
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  std::mutex stop_mutex;
  int port = 0;
  // Set when stop() gave the server up (a client kept a connection busy): from then on the
  // callbacks, whose owner may be gone, are not called, and the server's thread frees this
  // object once httplib lets it go. Guarded by `calls`, as listen_returned's last change is.
  std::mutex calls;
  bool abandoned = false;
  // The state requests answered, and when the last one was: serve_the_end() waits for a
  // watching page's next one.
  std::mutex served_mutex;
  std::condition_variable served_changed;
  uint64_t states_served = 0;
  std::chrono::steady_clock::time_point last_state_served;

  void note_state_served() {
    {
      std::lock_guard<std::mutex> lock(served_mutex);
      ++states_served;
      last_state_served = std::chrono::steady_clock::now();
    }
    served_changed.notify_all();
  }

  template <typename F>
  void answer(httplib::Response& res, const char* what, const char* content_type, F& body) {
    std::lock_guard<std::mutex> lock(calls);
    if (abandoned) {
      res.status = 503;
      res.set_content("the dashboard has stopped\n", "text/plain");
      return;
    }
    respond(res, what, content_type, body);
  }
};

namespace {
// How long stop() waits for the connections in flight. httplib's read timeout counts per recv,
// so a client that sends a byte now and then holds its connection's thread for as long as it
// likes, and stop() would wait for it for ever.
constexpr auto kStopWait = std::chrono::seconds(3);
std::atomic<int> g_abandoned{0};  // servers stop() gave up on whose thread has not ended
}  // namespace

int DashboardServer::abandoned_running() { return g_abandoned.load(); }

DashboardServer::DashboardServer(DashboardOptions options, std::function<std::string()> state,
                                 std::function<std::string()> metrics)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = std::move(options);
  s.state = std::move(state);
  s.metrics = std::move(metrics);
  if (!s.state || !s.metrics) throw Error("DashboardServer: state and metrics callbacks required");
  const std::string where = s.options.host + ":" + std::to_string(s.options.port);
  if (s.options.port < 0 || s.options.port > 65535)
    throw InputError("dashboard port out of range: " + where);
  // An empty host binds every interface (the wildcard), and skips the loopback Host check: a
  // script's unset variable would have served the cluster's state to the network.
  if (s.options.host.empty())
    throw InputError("dashboard host is empty: give a host name or address (the default is "
                     "127.0.0.1; 0.0.0.0 serves every interface)");

  httplib::Server& server = s.server;
  server.set_socket_options(reuse_address_only);
  // An idle keep-alive connection (a browser holds one) is dropped after 1 s, so stop() returns
  // within about a second instead of the default five.
  server.set_keep_alive_timeout(1);
  // Bodies are refused unread (screen()); a client that goes quiet for 2 s in the middle of a
  // request is dropped (a slow client holds one of httplib's threads; README: keep the
  // dashboard on loopback or behind a proxy).
  server.set_read_timeout(2);
  server.set_default_headers({{"X-Content-Type-Options", "nosniff"}});
  const DashboardOptions* served = &s.options;  // s outlives the server
  server.set_pre_routing_handler([served](const httplib::Request& req, httplib::Response& res) {
    return screen(*served, req, res);
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDashboardPage, sizeof(kDashboardPage) - 1, "text/html; charset=utf-8");
    res.set_header("Cache-Control", "no-store");
  });
  Impl* impl = impl_.get();
  server.Get("/api/state", [impl](const httplib::Request&, httplib::Response& res) {
    impl->answer(res, "state", "application/json", impl->state);
    impl->note_state_served();
  });
  server.Get("/metrics", [impl](const httplib::Request&, httplib::Response& res) {
    impl->answer(res, "metrics", "text/plain; version=0.0.4; charset=utf-8", impl->metrics);
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    res.set_content(res.status == 404 ? "not found: " + req.path + "\n"
                                      : "error " + std::to_string(res.status) + "\n",
                    "text/plain");
  });

  if (s.options.port == 0) {
    s.port = server.bind_to_any_port(s.options.host);
  } else {
    s.port = server.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  if (s.port <= 0)
    throw Error("dashboard cannot listen on " + where + ": " +
                bind_failure_reason(s.options.host, s.options.port));

  s.thread = std::thread([impl] {
    impl->server.listen_after_bind();
    bool owner;
    {
      std::lock_guard<std::mutex> lock(impl->calls);
      impl->listen_returned = true;
      owner = impl->abandoned;
    }
    if (!owner) return;
    { std::lock_guard<std::mutex> wait_for_stop(impl->stop_mutex); }  // stop() has returned
    delete impl;
    --g_abandoned;
  });
  // httplib's stop() does nothing until the accept loop has started, so wait for it here; a
  // stop() right after construction would otherwise leave the loop running forever.
  while (!server.is_running() && !impl->listen_returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  port_ = s.port;
  url_ = "http://" + url_host(s.options.host) + ":" + std::to_string(s.port) + "/";
}

DashboardServer::~DashboardServer() {
  try {
    stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: stopping the dashboard: %s\n", e.what());
  }
  if (abandoned_) (void)impl_.release();  // the server's thread frees it
}

int DashboardServer::port() const { return port_; }

std::string DashboardServer::url() const { return url_; }

void DashboardServer::serve_the_end(std::chrono::milliseconds at_most) {
  if (abandoned_ || !impl_) return;
  Impl& s = *impl_;
  // The page asks once a second: a request in the last 3 s is a page still open.
  constexpr auto kWatching = std::chrono::seconds(3);
  std::unique_lock<std::mutex> lock(s.served_mutex);
  const auto now = std::chrono::steady_clock::now();
  if (s.states_served == 0 || now - s.last_state_served > kWatching) return;
  const uint64_t seen = s.states_served;
  s.served_changed.wait_until(lock, now + at_most, [&] { return s.states_served > seen; });
}

void DashboardServer::stop() {
  if (abandoned_) return;
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.stop_mutex);
  if (!s.thread.joinable()) return;
  s.server.stop();
  const auto deadline = std::chrono::steady_clock::now() + kStopWait;
  while (!s.listen_returned && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard<std::mutex> calls(s.calls);
    s.abandoned = !s.listen_returned;
  }
  if (!s.abandoned) {
    s.thread.join();
    return;
  }
  abandoned_ = true;
  ++g_abandoned;  // (before the thread can end: it waits for stop_mutex, held here)
  s.thread.detach();
  std::fprintf(stderr,
               "tandem: the dashboard stopped listening, but a client still holds a connection "
               "after %lld s; it is left to end with the process\n",
               static_cast<long long>(kStopWait.count()));
}

}  // namespace tandem
