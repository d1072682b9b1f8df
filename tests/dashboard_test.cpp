// The dashboard's HTTP server (every route, over real loopback sockets on ephemeral ports) and the
// Prometheus text builder it serves.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "dashboard_server.h"
#include "prometheus_text.h"
#include "test_support.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// ---- PrometheusText ----

TEST(PrometheusText, WritesHelpAndTypeOncePerMetricAndGroupsItsSamples) {
  PrometheusText text;
  text.gauge("tandem_worker_samples_per_second", "Samples per second", 45000.5,
             {{"worker", "worker0"}});
  text.counter("tandem_ps_pushes_total", "Pushes received", 530, {{"server", "ps0"}});
  text.gauge("tandem_worker_samples_per_second", "Samples per second", 46000,
             {{"worker", "worker1"}});
  text.gauge("tandem_step", "Global step", 7);
  EXPECT_EQ(text.str(),
            "# HELP tandem_worker_samples_per_second Samples per second\n"
            "# TYPE tandem_worker_samples_per_second gauge\n"
            "tandem_worker_samples_per_second{worker=\"worker0\"} 45000.5\n"
            "tandem_worker_samples_per_second{worker=\"worker1\"} 46000\n"
            "# HELP tandem_ps_pushes_total Pushes received\n"
            "# TYPE tandem_ps_pushes_total counter\n"
            "tandem_ps_pushes_total{server=\"ps0\"} 530\n"
            "# HELP tandem_step Global step\n"
            "# TYPE tandem_step gauge\n"
            "tandem_step 7\n");
}

TEST(PrometheusText, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(PrometheusText::escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(PrometheusText::escape_help("x \\ \"y\"\nz"), "x \\\\ \"y\"\\nz");  // quotes stay
  PrometheusText text;
  text.gauge("m", "line one\nline two", 1, {{"path", "C:\\data\n\"x\""}, {"b", ""}});
  EXPECT_EQ(text.str(),
            "# HELP m line one\\nline two\n"
            "# TYPE m gauge\n"
            "m{path=\"C:\\\\data\\n\\\"x\\\"\",b=\"\"} 1\n");
}

TEST(PrometheusText, FormatsSpecialAndExactValues) {
  EXPECT_EQ(PrometheusText::format_value(0.0), "0");
  EXPECT_EQ(PrometheusText::format_value(-2.5), "-2.5");
  EXPECT_EQ(PrometheusText::format_value(0.1), "0.1");  // shortest round trip, not 0.1000000001
  EXPECT_EQ(PrometheusText::format_value(1e300), "1e+300");
  EXPECT_EQ(PrometheusText::format_value(std::nan("")), "NaN");
  EXPECT_EQ(PrometheusText::format_value(HUGE_VAL), "+Inf");
  EXPECT_EQ(PrometheusText::format_value(-HUGE_VAL), "-Inf");
  EXPECT_EQ(std::stod(PrometheusText::format_value(1.0 / 3.0)), 1.0 / 3.0);
}

TEST(PrometheusText, RejectsWhatAScrapeWouldReject) {
  PrometheusText text;
  EXPECT_THROW(text.gauge("", "h", 1), InputError);
  EXPECT_THROW(text.gauge("1abc", "h", 1), InputError);
  EXPECT_THROW(text.gauge("has-dash", "h", 1), InputError);
  EXPECT_THROW(text.gauge("m", "h", 1, {{"bad-label", "v"}}), InputError);
  EXPECT_THROW(text.gauge("m", "h", 1, {{"__reserved", "v"}}), InputError);
  EXPECT_THROW(text.gauge("m", "h", 1, {{"a", "1"}, {"a", "2"}}), InputError);
  EXPECT_THROW(text.counter("c_total", "h", -1), InputError);
  EXPECT_THROW(text.counter("c_total", "h", std::nan("")), InputError);
  text.gauge("ns:metric_1", "h", 1, {{"a", "1"}});
  EXPECT_THROW(text.gauge("ns:metric_1", "h", 2, {{"a", "1"}}), InputError);  // same series
  EXPECT_THROW(text.counter("ns:metric_1", "h", 2, {{"a", "2"}}), InputError);  // other type
  EXPECT_THROW(text.gauge("ns:metric_1", "other", 2, {{"a", "2"}}), InputError);
  text.gauge("ns:metric_1", "h", 2, {{"a", "2"}});
  EXPECT_EQ(text.str(), "# HELP ns:metric_1 h\n# TYPE ns:metric_1 gauge\n"
                        "ns:metric_1{a=\"1\"} 1\nns:metric_1{a=\"2\"} 2\n");
}

// ---- DashboardServer ----

const char* kState = R"({"cluster": {"state": "training", "elapsed_s": 1.5, "epoch": 1, "step": 3,
  "target": 1700.0, "samples_per_s": 1000.0},
  "roles": [{"role": "ps", "name": "ps0", "address": "tcp://127.0.0.1:1", "state": "running",
             "pid": 1, "host": "h", "last_seen_s": 0.1}],
  "scores": [], "workers": [], "servers": []})";

DashboardServer start(std::atomic<int>* state_calls = nullptr) {
  return DashboardServer(
      DashboardOptions{"127.0.0.1", 0},
      [state_calls] {
        if (state_calls) ++*state_calls;
        return std::string(kState);
      },
      [] {
        PrometheusText text;
        text.gauge("tandem_step", "Global step", 3);
        return text.str();
      });
}

// A plain TCP connection to the server, for requests httplib's client will not send (-1 when
// it cannot connect).
int connect_raw(const DashboardServer& server) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server.port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return fd;
  ::close(fd);
  return -1;
}

httplib::Result get(const DashboardServer& server, const std::string& path) {
  httplib::Client client("127.0.0.1", server.port());
  client.set_connection_timeout(std::chrono::seconds(5));
  client.set_read_timeout(std::chrono::seconds(5));
  return client.Get(path.c_str());
}

TEST(DashboardServer, ServesHealthStateMetricsPageAnd404) {
  std::atomic<int> state_calls{0};
  DashboardServer server = start(&state_calls);
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()) + "/");

  auto health = get(server, "/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");

  auto state = get(server, "/api/state");
  ASSERT_TRUE(state) << httplib::to_string(state.error());
  EXPECT_EQ(state->status, 200);
  EXPECT_EQ(state->get_header_value("Content-Type"), "application/json");
  const auto doc = nlohmann::json::parse(state->body);
  EXPECT_EQ(doc["roles"][0]["name"], "ps0");
  EXPECT_EQ(doc["cluster"]["state"], "training");
  EXPECT_EQ(state_calls.load(), 1);

  auto metrics = get(server, "/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u)
      << metrics->get_header_value("Content-Type");
  EXPECT_EQ(metrics->body, "# HELP tandem_step Global step\n# TYPE tandem_step gauge\ntandem_step 3\n");

  auto page = get(server, "/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type").rfind("text/html", 0), 0u);
  for (const char* id : {"id=\"roles\"", "id=\"score-curve\"", "id=\"workers\"",
                         "id=\"servers\"", "id=\"staleness\"", "id=\"status\"", "api/state",
                         "</html>"})
    EXPECT_NE(page->body.find(id), std::string::npos) << "page lacks " << id;
  // Self-contained: nothing fetched from elsewhere (the SVG namespace is a name, not a fetch, and
  // the empty data: icon stops the browser asking for /favicon.ico).
  std::string body = page->body;
  for (const std::string allowed : {"http://www.w3.org/2000/svg", "href=\"data:,\""})
    for (size_t at; (at = body.find(allowed)) != std::string::npos;) body.erase(at, allowed.size());
  for (const char* fetch : {"http:", "https:", "src=", "href=", "url(", "@import"})
    EXPECT_EQ(body.find(fetch), std::string::npos) << "page fetches with " << fetch;

  for (const char* path : {"/nope", "/api/state/x", "/metricsx", "/index.html"}) {
    auto missing = get(server, path);
    ASSERT_TRUE(missing) << path << ": " << httplib::to_string(missing.error());
    EXPECT_EQ(missing->status, 404) << path;
  }
}

// The dashboard reads nothing from its clients: other methods are refused before their body is
// read (before, a POST's whole body went into memory for a 404), and on loopback a request
// addressed to another name (a page's own domain resolving to 127.0.0.1) is refused.
TEST(DashboardServer, RefusesOtherMethodsAndForeignHostNames) {
  std::atomic<int> state_calls{0};
  DashboardServer server = start(&state_calls);
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(std::chrono::seconds(5));
  auto post = client.Post("/api/state", std::string(1000, 'x'), "text/plain");
  ASSERT_TRUE(post) << httplib::to_string(post.error());
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  auto put = client.Put("/", "x", "text/plain");
  ASSERT_TRUE(put) << httplib::to_string(put.error());
  EXPECT_EQ(put->status, 405);

  const std::string port = std::to_string(server.port());
  for (const std::string& host :
       {"evil.example:" + port, std::string("evil.example"), "127.0.0.1.evil.example:" + port}) {
    auto foreign = client.Get("/api/state", {{"Host", host}});
    ASSERT_TRUE(foreign) << host << ": " << httplib::to_string(foreign.error());
    EXPECT_EQ(foreign->status, 403) << host;
  }
  EXPECT_EQ(state_calls.load(), 0);
  for (const std::string& host : {"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port,
                                  "LocalHost.:" + port}) {
    auto own = client.Get("/api/state", {{"Host", host}});
    ASSERT_TRUE(own) << host << ": " << httplib::to_string(own.error());
    EXPECT_EQ(own->status, 200) << host;
  }
  auto missing = get(server, "/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->get_header_value("X-Content-Type-Options"), "nosniff");
}

// A chunked body (no length to refuse up front) is not waited for: the 405 comes at once.
TEST(DashboardServer, AChunkedPostIsAnsweredBeforeItsBodyIsSent) {
  DashboardServer server = start();
  const int fd = connect_raw(server);
  ASSERT_GE(fd, 0);
  const timeval wait{1, 500000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  const std::string headers =
      "POST /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(::send(fd, headers.data(), headers.size(), MSG_NOSIGNAL), ssize_t(headers.size()));
  char reply[64] = {};
  const ssize_t n = ::recv(fd, reply, sizeof reply - 1, 0);
  ::close(fd);
  ASSERT_GT(n, 0) << "no answer within 1.5 s: the server waits for the body";
  EXPECT_EQ(std::string(reply).rfind("HTTP/1.1 405", 0), 0u) << reply;
}

TEST(DashboardServer, ACallbackThatThrowsGivesA500NamingTheError) {
  DashboardServer server(
      DashboardOptions{"127.0.0.1", 0}, []() -> std::string { throw Error("no coordinator"); },
      [] { return std::string(); });
  auto state = get(server, "/api/state");
  ASSERT_TRUE(state) << httplib::to_string(state.error());
  EXPECT_EQ(state->status, 500);
  EXPECT_NE(state->body.find("no coordinator"), std::string::npos) << state->body;
  auto health = get(server, "/healthz");  // still serving
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(DashboardServer, ASecondServerOnTheSamePortFailsNamingHostPortAndWhy) {
  DashboardServer first = start();
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  try {
    DashboardServer second(DashboardOptions{"127.0.0.1", first.port()},
                           [] { return std::string("{}"); }, [] { return std::string(); });
    FAIL() << "a second dashboard bound " << where;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(where), std::string::npos) << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
  }
  // The first one still answers.
  auto health = get(first, "/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok");
}

TEST(DashboardServer, BadHostFailsWithAClearMessage) {
  try {
    DashboardServer server(DashboardOptions{"192.0.2.1", 0}, [] { return std::string("{}"); },
                           [] { return std::string(); });  // TEST-NET-1: not an address of ours
    FAIL() << "bound 192.0.2.1";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("192.0.2.1:0"), std::string::npos) << what;
    EXPECT_NE(what.find("assign"), std::string::npos) << what;  // "Cannot assign requested address"
  }
  EXPECT_THROW(DashboardServer(DashboardOptions{"127.0.0.1", 70000}, [] { return std::string(); },
                               [] { return std::string(); }),
               InputError);
  // An empty host (a script's unset variable) bound every interface, without the loopback check.
  const std::string why = test::error_of<InputError>([] {
    DashboardServer(DashboardOptions{"", 0}, [] { return std::string(); },
                    [] { return std::string(); });
  });
  EXPECT_TRUE(test::contains(why, "dashboard host is empty")) << why;
}

// A client that sends its request a byte at a time holds its connection's thread past the read
// timeout (which counts per recv): stop() waited for it for as long as it kept sending.
TEST(DashboardServer, StopReturnsWhileAClientTricklesItsRequest) {
  std::atomic<int> state_calls{0};
  DashboardServer server = start(&state_calls);
  const int fd = connect_raw(server);
  ASSERT_GE(fd, 0);
  const std::string start_of_request = "GET /api/state HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  ASSERT_EQ(::send(fd, start_of_request.data(), start_of_request.size(), MSG_NOSIGNAL),
            ssize_t(start_of_request.size()));
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int i = 0; i < 120 && !done; ++i) {  // a minute at most
      (void)::send(fd, "x", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  server.stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  done = true;
  trickle.join();
  EXPECT_EQ(DashboardServer::abandoned_running(), 1);
  ::close(fd);
  EXPECT_LT(took, std::chrono::seconds(20)) << "stop() waited for the trickling client";
  EXPECT_EQ(state_calls.load(), 0);
  // The client gone, the given-up server ends and frees itself (not left for the process's end).
  EXPECT_TRUE(test::eventually([] { return DashboardServer::abandoned_running() == 0; }, 20000,
                               20));
}

TEST(DashboardServer, StopsPromptlyAndTwiceAndThePortIsFreedAgain) {
  int port = 0;
  {
    DashboardServer server = start();
    port = server.port();
    // A keep-alive client connection still open while stopping.
    httplib::Client client("127.0.0.1", port);
    client.set_keep_alive(true);
    ASSERT_TRUE(client.Get("/healthz"));
    const auto t0 = std::chrono::steady_clock::now();
    server.stop();
    server.stop();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
    EXPECT_FALSE(get(server, "/healthz"));
  }
  // The same port can be taken again at once (SO_REUSEADDR, no lingering listener).
  DashboardServer again(DashboardOptions{"127.0.0.1", port}, [] { return std::string("{}"); },
                        [] { return std::string(); });
  EXPECT_EQ(again.port(), port);
  auto health = get(again, "/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok");
}

// The end of a run: a page watching it gets the final state before the server goes; with no
// page watching, the run ends at once.
TEST(DashboardServer, AWatchingPageIsServedTheEndBeforeTheServerStops) {
  std::atomic<int> state_calls{0};
  DashboardServer server = start(&state_calls);
  auto t0 = std::chrono::steady_clock::now();
  server.serve_the_end(std::chrono::seconds(30));  // no page has asked: no wait
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));

  ASSERT_TRUE(get(server, "/api/state"));  // a page watching
  std::atomic<bool> done{false};
  t0 = std::chrono::steady_clock::now();
  std::thread end([&] {
    server.serve_the_end(std::chrono::seconds(30));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "returned before the page asked again";
  EXPECT_TRUE(get(server, "/api/state"));  // the page's next look: the final state
  end.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(state_calls.load(), 2);
}

}  // namespace
}  // namespace tandem
