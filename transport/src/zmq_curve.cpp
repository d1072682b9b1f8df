#include "zmq_curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "zmq_through_signals.h"

namespace tandem::transport {
namespace {

constexpr size_t kZ85KeyChars = 40;
constexpr size_t kKeyBytes = 32;
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr size_t kRefusedKeysLogged = 100;  // refused client keys logged per domain
constexpr const char* kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string z85_of(const std::string& bytes) {
  char out[kZ85KeyChars + 1] = {};
  if (bytes.size() != kKeyBytes ||
      zmq_z85_encode(out, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == nullptr)
    return "(not a 32-byte key)";
  return out;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string errno_text() { return std::strerror(errno); }

// `text` in a new file beside `path` (mode `mode` exactly), on disk before this returns; its name.
std::string write_temp_file(const std::string& path, const std::string& text, mode_t mode) {
  // A random name, tried again when taken: one a killed run left behind (its pid the same in a
  // container's next run) must not block every later one.
  std::random_device entropy;
  std::string temp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, ".tmp-%08x%08x", entropy(), entropy());
    temp = path + suffix;
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0 && (errno != EEXIST || attempt == 20))
      throw IoError(path + ": cannot create " + temp + ": " + errno_text());
  }
  const auto fail = [&](const std::string& what) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(temp.c_str());
    throw IoError(path + ": " + what + ": " + why);
  };
  if (::fchmod(fd, mode) != 0) fail("cannot set the mode of " + temp);  // (the umask aside)
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write " + temp);
    done += size_t(n);
  }
  if (::fsync(fd) != 0) fail("cannot write " + temp + " to disk");
  if (::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    throw IoError(path + ": cannot close " + temp + ": " + why);
  }
  return temp;
}

// Puts a file written by write_temp_file at `path`. rename() replaces whatever is there (a
// symbolic link itself, never what it points to); without `replace`, link() puts it only where
// nothing is, so a file made there since it was looked for is not overwritten.
void put_in_place(const std::string& temp, const std::string& path, bool replace) {
  int status = replace ? ::rename(temp.c_str(), path.c_str())
                       : ::link(temp.c_str(), path.c_str());
  int err = errno;
  std::string tried;  // what failed before the last try, for the message
  if (!replace && status != 0 && err != EEXIST) {
    // A file system without hard links (some FUSE and SMB mounts): rename without replacing.
    tried = std::string("link: ") + std::strerror(err) + "; renameat2(RENAME_NOREPLACE): ";
    status = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE);
    err = errno;
    if (status == 0) return;
  }
  if (!replace || status != 0) ::unlink(temp.c_str());
  if (status == 0) return;
  if (err == EEXIST)
    throw InputError(path + " exists: a new key pair would lock out the peers that have the old "
                     "public key (--overwrite, or overwrite=True, replaces it)");
  throw IoError(path + ": cannot put the new file in place: " + tried + std::strerror(err));
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(path + ": cannot open: " + errno_text());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (in.bad()) throw IoError(path + ": cannot read: " + errno_text());
  return lines;
}

}  // namespace

void require_curve() {
  if (!zmq_has("curve"))
    throw TransportError("ZeroMQ CURVE: this libzmq was built without CURVE support");
}

void validate_curve_key(const std::string& key, const std::string& what) {
  if (key.size() != kZ85KeyChars)
    throw TransportError(what + ": a CURVE key is " + std::to_string(kZ85KeyChars) +
                         " Z85 characters, got " + std::to_string(key.size()));
  // The key's characters are never quoted: it may be a secret key, and an error text ends up in
  // logs. Positions say where the problem is.
  for (size_t i = 0; i < key.size(); ++i)
    if (key[i] == '\0' || std::strchr(kZ85Alphabet, key[i]) == nullptr)
      throw TransportError(what + ": character " + std::to_string(i + 1) +
                           " of the CURVE key is not a Z85 character");
  for (size_t group = 0; group < kZ85KeyChars; group += 5) {
    uint64_t value = 0;  // five base-85 digits: at most 85^5 - 1, past 2^32 - 1 for some
    for (size_t i = group; i < group + 5; ++i)
      value = value * 85 + uint64_t(std::strchr(kZ85Alphabet, key[i]) - kZ85Alphabet);
    if (value > 0xFFFFFFFFull)
      throw TransportError(what + ": characters " + std::to_string(group + 1) + " to " +
                           std::to_string(group + 5) + " of the CURVE key do not decode as Z85 " +
                           "(their group is past 2^32 - 1)");
  }
  uint8_t bytes[kKeyBytes];
  if (zmq_z85_decode(bytes, key.c_str()) == nullptr)
    throw TransportError(what + ": the CURVE key does not decode as Z85");
}

std::string curve_key_bytes(const std::string& key, const std::string& what) {
  validate_curve_key(key, what);
  uint8_t bytes[kKeyBytes];
  zmq_z85_decode(bytes, key.c_str());
  return std::string(reinterpret_cast<const char*>(bytes), kKeyBytes);
}

CurveKeyPair generate_curve_keypair() {
  require_curve();
  char pub[kZ85KeyChars + 1] = {}, sec[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    throw TransportError(std::string("ZeroMQ CURVE: cannot generate a key pair: ") +
                         zmq_strerror(zmq_errno()));
  return {pub, sec};
}

std::string curve_public_from_secret(const std::string& secret) {
  require_curve();
  validate_curve_key(secret, "CURVE secret key");
  char pub[kZ85KeyChars + 1] = {};
  if (zmq_curve_public(pub, secret.c_str()) != 0)
    throw TransportError(std::string("ZeroMQ CURVE: cannot derive the public key: ") +
                         zmq_strerror(zmq_errno()));
  return pub;
}

void write_curve_key_files(const std::string& path_prefix, const CurveKeyPair& pair,
                           bool replace_existing) {
  // A prefix given as a file name (k1.key, k1.key_secret) would make k1.key.key.
  for (const std::string suffix : {".key", ".key_secret"})
    if (path_prefix.size() > suffix.size() &&
        path_prefix.compare(path_prefix.size() - suffix.size(), suffix.size(), suffix) == 0)
      throw InputError(path_prefix + ": give the prefix of the two files, without " + suffix +
                       " (they are PREFIX.key and PREFIX.key_secret)");
  for (const char* suffix : {".key", ".key_secret"}) {
    std::error_code ec;
    const auto status = std::filesystem::symlink_status(path_prefix + suffix, ec);
    if (!replace_existing && std::filesystem::exists(status))
      throw InputError(path_prefix + suffix + " exists: a new key pair would lock out the " +
                       "peers that have the old public key (--overwrite, or overwrite=True, " +
                       "replaces it)");
  }
  validate_curve_key(pair.public_key, path_prefix + ".key: public key");
  validate_curve_key(pair.secret_key, path_prefix + ".key_secret: secret key");
  if (curve_public_from_secret(pair.secret_key) != pair.public_key)
    throw TransportError(path_prefix + ": the public key does not belong to the secret key");
  const std::string head = "#   ZeroMQ CURVE ";
  const std::string pub_line = "    public-key = \"" + pair.public_key + "\"\n";
  // Both files are written whole and on disk before either is put in place, the secret first: a
  // full disk or a crash leaves the old pair (or none), never a public key without its secret.
  const std::string secret_temp = write_temp_file(
      path_prefix + ".key_secret",
      head + "**Secret** Certificate (zcert format), written by Tandem\n"
             "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n"
             "metadata\ncurve\n" + pub_line + "    secret-key = \"" + pair.secret_key + "\"\n",
      0600);
  std::string public_temp;
  try {
    public_temp = write_temp_file(path_prefix + ".key",
                                  head + "Public Certificate (zcert format), written by Tandem\n"
                                         "#   Give this file to the peers that must know this "
                                         "key.\n\nmetadata\ncurve\n" + pub_line,
                                  0644);
    put_in_place(secret_temp, path_prefix + ".key_secret", replace_existing);
  } catch (...) {
    ::unlink(secret_temp.c_str());
    if (!public_temp.empty()) ::unlink(public_temp.c_str());
    throw;
  }
  try {
    put_in_place(public_temp, path_prefix + ".key", replace_existing);
  } catch (const std::exception& e) {
    // A public file made there meanwhile: the new secret must not stay without its public key.
    if (!replace_existing) {
      ::unlink((path_prefix + ".key_secret").c_str());
      throw;
    }
    // The old secret is replaced already: said, since the two files no longer match.
    throw IoError(std::string(e.what()) + "; " + path_prefix + ".key_secret holds the new " +
                  "secret key, which does not match " + path_prefix + ".key: write the pair " +
                  "again once that is fixed");
  }
}

CurveKeyPair read_curve_key_file(const std::string& path) {
  CurveKeyPair pair;
  const std::vector<std::string> lines = read_lines(path);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string line = trim(lines[i]);
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;  // a section name ("metadata", "curve")
    const std::string name = trim(line.substr(0, eq));
    std::string value = trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value[0] == '"' || value[0] == '\'') && value.back() == value[0])
      value = value.substr(1, value.size() - 2);
    std::string* field = name == "public-key"   ? &pair.public_key
                         : name == "secret-key" ? &pair.secret_key
                                                : nullptr;
    if (field == nullptr) continue;
    const std::string where = path + " line " + std::to_string(i + 1) + ": " + name;
    if (!field->empty()) throw TransportError(where + " appears twice");
    validate_curve_key(value, where);
    *field = value;
  }
  if (pair.public_key.empty())
    throw TransportError(path + ": no public-key line (not a CURVE key file)");
  if (!pair.secret_key.empty() && curve_public_from_secret(pair.secret_key) != pair.public_key)
    throw TransportError(path + ": secret-key does not belong to public-key");
  return pair;
}

namespace {

// A warning on stderr when `path`'s mode has any of `bits`: "tandem: warning: WHAT PATH
// HOW (mode 0644): RISK; FIX PATH".
void warn_if_open_to_others(const std::string& path, mode_t bits, const char* what,
                            const char* how, const char* risk, const char* fix) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & bits) == 0) return;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  std::fprintf(stderr, "tandem: warning: %s %s %s (mode %s): %s; %s %s\n", what, path.c_str(), how,
               mode, risk, fix, path.c_str());
}

}  // namespace

CurveKeyPair read_curve_secret_key_file(const std::string& path) {
  CurveKeyPair pair = read_curve_key_file(path);
  if (pair.secret_key.empty())
    throw InputError(path + " holds no secret key (give the .key_secret file)");
  // Written 0600 (write_curve_key_files); a copy made by hand often loses that. Said, as ssh
  // does, though not refused: the key still works, and whoever can read it can pose as this role.
  warn_if_open_to_others(path, 077, "the secret key file", "can be read by others",
                         "whoever reads it can pose as this role", "chmod 600");
  return pair;
}

std::vector<std::string> read_curve_allowed_clients(const std::string& path) {
  std::vector<std::string> keys;
  std::error_code ec;
  // Whoever can write the list (or add a file to the directory) admits a key of their own.
  warn_if_open_to_others(path, 022, "the allowed keys", "can be written by others",
                         "whoever writes there admits a key of their own", "chmod go-w");
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (std::filesystem::directory_iterator it(path, ec), end; !ec && it != end;
         it.increment(ec))
      if (it->path().extension() == ".key") files.push_back(it->path().string());
    if (ec) throw IoError(path + ": cannot list: " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) keys.push_back(read_curve_key_file(f).public_key);
  } else {
    const std::vector<std::string> lines = read_lines(path);
    // One client's key file (tandem keygen's PREFIX.key) is a list of one.
    for (const std::string& line : lines)
      if (trim(line).rfind("public-key", 0) == 0) return {read_curve_key_file(path).public_key};
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string line = trim(lines[i]);
      // '#' is a Z85 character, but never a key's first: a group starting with it overflows.
      if (line.empty() || line[0] == '#') continue;
      validate_curve_key(line, path + " line " + std::to_string(i + 1));
      keys.push_back(line);
    }
  }
  if (keys.empty())
    throw TransportError(path + ": no CURVE public keys (an empty allowed list would admit any "
                                "key holder; leave the list out to mean that)");
  return keys;
}

// ---- ZAP ------------------------------------------------------------------------------------

namespace {

struct ZapDomain {
  std::set<std::string> keys;  // raw 32-byte public keys; empty: any
  std::shared_ptr<std::atomic<int64_t>> rejected;
  std::set<std::string> logged;  // keys already logged as rejected
};

// One handler per context (see the header). The registry's mutex also serialises starting and
// stopping handlers, so a context never has two binding at once.
struct ZapRegistry {
  std::mutex mutex;
  std::map<void*, std::unique_ptr<ZapAuthenticator>> by_context;
};

ZapRegistry& registry() {
  static ZapRegistry* r = new ZapRegistry;  // never destroyed: registrations may outlive statics
  return *r;
}

std::atomic<uint64_t> next_wake_id{0};

}  // namespace

struct ZapAuthenticator::State {
  zmq::socket_t handler;  // REP at kZapEndpoint: the thread's
  zmq::socket_t wake_rx;  // PAIR: the thread's; a message here means stop
  zmq::socket_t wake_tx;  // PAIR: the owner's
  std::string wake_endpoint;
  std::mutex mutex;  // guards domains
  std::map<std::string, ZapDomain> domains;
  std::thread thread;
};

ZapAuthenticator::ZapAuthenticator(zmq::context_t& context) : state_(std::make_unique<State>()) {
  State& s = *state_;
  try {
    s.handler = zmq::socket_t(context, zmq::socket_type::rep);
    s.handler.set(zmq::sockopt::linger, 0);
    // A handler that closed a moment ago may still hold the address inside libzmq (inproc
    // endpoints are released by its reaper thread); give it a little time.
    for (int attempt = 0;; ++attempt) {
      try {
        s.handler.bind(kZapEndpoint);
        break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EADDRINUSE || attempt >= 50) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    s.wake_endpoint = "inproc://tandem-zap-wake-" + std::to_string(next_wake_id++);
    s.wake_rx = zmq::socket_t(context, zmq::socket_type::pair);
    s.wake_rx.set(zmq::sockopt::linger, 0);
    s.wake_rx.bind(s.wake_endpoint);
    s.wake_tx = zmq::socket_t(context, zmq::socket_type::pair);
    s.wake_tx.set(zmq::sockopt::linger, 0);
    s.wake_tx.connect(s.wake_endpoint);
  } catch (const zmq::error_t& e) {
    throw TransportError(std::string("ZeroMQ ZAP handler at ") + kZapEndpoint +
                         ": cannot start: " + e.what() +
                         (e.num() == EADDRINUSE ? " (another ZAP handler serves this context)" : ""));
  }
  s.thread = std::thread([this] { serve(); });
}

ZapAuthenticator::~ZapAuthenticator() {
  State& s = *state_;
  try {
    send_through_signals(s.wake_tx, zmq::const_buffer("", 0), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "tandem ZAP handler: cannot signal stop: %s\n", e.what());
  }
  if (s.thread.joinable()) s.thread.join();
  // Unbind first: that frees the inproc addresses at once, so a new handler can bind them.
  try {
    s.handler.unbind(kZapEndpoint);
    s.wake_rx.unbind(s.wake_endpoint);
  } catch (const zmq::error_t&) {
  }
  s.wake_tx.close();
  s.wake_rx.close();
  s.handler.close();
}

void ZapAuthenticator::serve() {
  State& s = *state_;
  const std::string where = std::string("ZAP handler at ") + kZapEndpoint;
  try {
    for (;;) {
      zmq::pollitem_t items[] = {{s.handler.handle(), 0, ZMQ_POLLIN, 0},
                                 {s.wake_rx.handle(), 0, ZMQ_POLLIN, 0}};
      poll_through_signals(items, 2, std::chrono::milliseconds(-1));
      if (items[1].revents & ZMQ_POLLIN) return;
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      Frames request;
      if (!receive_frames(s.handler, request, 0, where)) continue;
      auto text = [&](size_t i) {
        return i < request.size() ? std::string(static_cast<const char*>(request[i].data()),
                                                request[i].size())
                                  : std::string();
      };
      // RFC 27: version, request id, domain, address, identity, mechanism, credentials...
      const std::string version = text(0), request_id = text(1), domain = text(2),
                        address = text(3), mechanism = text(5), key = text(6);
      std::string status = "400", reason, user;
      if (version != "1.0" || request.size() < 6) {
        status = "500";
        reason = "malformed ZAP request";
      } else {
        std::lock_guard<std::mutex> lock(s.mutex);
        const auto it = s.domains.find(domain);
        if (it == s.domains.end()) {
          reason = "unknown ZAP domain";
        } else if (mechanism != "CURVE" || key.size() != kKeyBytes) {
          reason = "CURVE required";
          ++*it->second.rejected;
        } else if (!it->second.keys.empty() && it->second.keys.count(key) == 0) {
          reason = "client key not allowed";
          ++*it->second.rejected;
          // Logged once per key, for the first keys only: anyone with the server's public key
          // can handshake under fresh keys, and each would cost a line and a set entry.
          std::set<std::string>& logged = it->second.logged;
          if (logged.size() < kRefusedKeysLogged && logged.insert(key).second)
            std::fprintf(stderr,
                         "tandem ZAP handler (domain %s): refused CURVE client key %s from %s: not "
                         "in the allowed list (logged once per key, for the first %zu keys)\n",
                         domain.c_str(), z85_of(key).c_str(), address.c_str(), kRefusedKeysLogged);
        } else {
          status = "200";
          reason = "OK";
          user = z85_of(key);  // the connection's user id: the client's public key
        }
      }
      const std::string empty;
      const std::vector<ByteSpan> reply = {
          {reinterpret_cast<const uint8_t*>("1.0"), 3},
          {reinterpret_cast<const uint8_t*>(request_id.data()), request_id.size()},
          {reinterpret_cast<const uint8_t*>(status.data()), status.size()},
          {reinterpret_cast<const uint8_t*>(reason.data()), reason.size()},
          {reinterpret_cast<const uint8_t*>(user.data()), user.size()},
          {reinterpret_cast<const uint8_t*>(empty.data()), 0}};
      send_frames(s.handler, reply, nullptr, where);
    }
  } catch (const std::exception& e) {
    // Unanswered ZAP requests leave connections refused, never admitted.
    std::fprintf(stderr, "tandem %s stopped: %s\n", where.c_str(), e.what());
  }
}

ZapAuthenticator::Registration ZapAuthenticator::allow(zmq::context_t& context,
                                                       const std::string& domain,
                                                       const std::vector<std::string>& keys) {
  require_curve();
  ZapDomain d;
  for (size_t i = 0; i < keys.size(); ++i)
    d.keys.insert(curve_key_bytes(keys[i], "allowed client key " + std::to_string(i + 1)));
  d.rejected = std::make_shared<std::atomic<int64_t>>(0);
  if (domain.empty() || domain.size() > 254)
    throw TransportError("ZAP domain '" + domain + "': must be 1 to 254 characters");
  ZapRegistry& r = registry();
  std::lock_guard<std::mutex> registry_lock(r.mutex);
  std::unique_ptr<ZapAuthenticator>& auth = r.by_context[context.handle()];
  if (!auth) {
    try {
      auth.reset(new ZapAuthenticator(context));
    } catch (...) {
      r.by_context.erase(context.handle());
      throw;
    }
  }
  Registration reg;
  reg.context_ = context.handle();
  reg.domain_ = domain;
  reg.rejected_ = d.rejected;
  std::lock_guard<std::mutex> lock(auth->state_->mutex);
  if (!auth->state_->domains.emplace(domain, std::move(d)).second) {
    reg.context_ = nullptr;  // not ours to release
    throw TransportError("ZAP domain '" + domain + "' is already registered on this context");
  }
  return reg;
}

void ZapAuthenticator::Registration::release() {
  if (context_ == nullptr) return;
  ZapRegistry& r = registry();
  std::lock_guard<std::mutex> registry_lock(r.mutex);
  const auto it = r.by_context.find(context_);
  context_ = nullptr;
  if (it == r.by_context.end()) return;
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(it->second->state_->mutex);
    it->second->state_->domains.erase(domain_);
    last = it->second->state_->domains.empty();
  }
  if (last) r.by_context.erase(it);  // stops the thread, closes the sockets
}

ZapAuthenticator::Registration::~Registration() { release(); }

ZapAuthenticator::Registration::Registration(Registration&& other) noexcept
    : context_(other.context_), domain_(std::move(other.domain_)),
      rejected_(std::move(other.rejected_)) {
  other.context_ = nullptr;
}

ZapAuthenticator::Registration& ZapAuthenticator::Registration::operator=(
    Registration&& other) noexcept {
  if (this != &other) {
    release();
    context_ = other.context_;
    domain_ = std::move(other.domain_);
    rejected_ = std::move(other.rejected_);
    other.context_ = nullptr;
  }
  return *this;
}

}  // namespace tandem::transport
