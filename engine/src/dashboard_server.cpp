#include "dashboard_server.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

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

}  // namespace

struct DashboardServer::Impl {
  DashboardOptions options;
  std::function<std::string()> state, metrics;
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  std::mutex stop_mutex;
  int port = 0;
};

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

  httplib::Server& server = s.server;
  server.set_socket_options(reuse_address_only);
  // An idle keep-alive connection (a browser holds one) is dropped after 1 s, so stop() returns
  // within about a second instead of the default five.
  server.set_keep_alive_timeout(1);
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDashboardPage, sizeof(kDashboardPage) - 1, "text/html; charset=utf-8");
    res.set_header("Cache-Control", "no-store");
  });
  Impl* impl = impl_.get();
  server.Get("/api/state", [impl](const httplib::Request&, httplib::Response& res) {
    respond(res, "state", "application/json", impl->state);
  });
  server.Get("/metrics", [impl](const httplib::Request&, httplib::Response& res) {
    respond(res, "metrics", "text/plain; version=0.0.4; charset=utf-8", impl->metrics);
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
    impl->listen_returned = true;
  });
  // httplib's stop() does nothing until the accept loop has started, so wait for it here; a
  // stop() right after construction would otherwise leave the loop running forever.
  while (!server.is_running() && !impl->listen_returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

DashboardServer::~DashboardServer() {
  try {
    stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: stopping the dashboard: %s\n", e.what());
  }
}

int DashboardServer::port() const { return impl_->port; }

std::string DashboardServer::url() const {
  return "http://" + url_host(impl_->options.host) + ":" + std::to_string(impl_->port) + "/";
}

void DashboardServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mutex);
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace tandem
