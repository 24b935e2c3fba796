// bench_webhook: Telegram webhook throughput and latency.
//
// A load generator in this executable (one thread, Asio) keeps 40
// keep-alive connections busy posting ~1 KB Telegram updates over 10 000
// chats; the bot answers each in the webhook response (reply in webhook).
// The baseline is a bare Beast hello-world server with the same number of
// I/O threads, measured in the same run. For scale, a grammY bot on Node
// (benchmarks/grammy/webhook_bot.js, a child process; one JavaScript
// thread whatever --threads says) answers the same load from the same
// generator when node and its node_modules are there (`npm ci --prefix
// benchmarks/grammy`), else a `# grammy: not measured: <why>` line says
// so. Rounds alternate baseline, webhook and grammY (after a warm-up pass
// for V8 that is not counted); the ratios are the median over rounds.
//
//   bench_webhook [--rounds N] [--seconds S] [--threads T] [--connections C]
//                 [--grammy 0|1]
//
// Prints `bench <name> <value> <unit>` and `ratio <name> <value>` lines.

#include <algorithm>
#include <utility>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <botmesh/providers/telegram/telegram_webhook.hpp>

#include <botmesh/runtime/botmesh.hpp>

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using steady = std::chrono::steady_clock;

namespace {

constexpr const char* secret = "bench-secret";
constexpr int chats = 10000;

// -- bare Beast hello world ---------------------------------------------------

class hello_session : public std::enable_shared_from_this<hello_session> {
 public:
  explicit hello_session(tcp::socket s) : stream_(std::move(s)) {
    // nop
  }

  void read() {
    req_ = {};
    bhttp::async_read(stream_, buf_, req_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (!ec)
                          self->write();
                      });
  }

 private:
  void write() {
    res_ = {};
    res_.result(bhttp::status::ok);
    res_.version(11);
    res_.set(bhttp::field::content_type, "application/json");
    res_.body() = R"({"method":"sendMessage","chat_id":1,"text":"ok"})";
    res_.keep_alive(req_.keep_alive());
    res_.prepare_payload();
    bhttp::async_write(stream_, res_,
                       [self = shared_from_this()](beast::error_code ec, std::size_t) {
                         if (!ec)
                           self->read();
                       });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  bhttp::request<bhttp::string_body> req_;
  bhttp::response<bhttp::string_body> res_;
};

class hello_server {
 public:
  explicit hello_server(std::size_t threads)
    : acceptor_(ioc_, tcp::endpoint{net::ip::make_address("127.0.0.1"), 0}) {
    accept();
    for (std::size_t i = 0; i < threads; ++i)
      threads_.emplace_back([this] { ioc_.run(); });
  }

  ~hello_server() {
    ioc_.stop();
    for (auto& t : threads_)
      t.join();
  }

  std::uint16_t port() const {
    return acceptor_.local_endpoint().port();
  }

 private:
  void accept() {
    acceptor_.async_accept(net::make_strand(ioc_),
                           [this](beast::error_code ec, tcp::socket s) {
                             if (ec)
                               return;
                             s.set_option(tcp::no_delay{true});
                             std::make_shared<hello_session>(std::move(s))->read();
                             accept();
                           });
  }

  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
};

// -- grammY reference bot ------------------------------------------------------

// benchmarks/grammy/webhook_bot.js run by node as a child process: a grammY
// bot answering the same updates in its webhook response. It is measured
// only when node is on PATH and `npm ci --prefix benchmarks/grammy` has
// installed its node_modules. The child is stopped by the destructor, and
// by the kernel (PR_SET_PDEATHSIG) if this process dies without unwinding.
class grammy_bot {
 public:
  /// Starts the bot; nullopt with `why` set when it cannot be measured.
  static std::optional<grammy_bot> start(std::string& why) {
    namespace fs = std::filesystem;
    fs::path dir = BOTMESH_GRAMMY_DIR;
    if (auto* d = std::getenv("BOTMESH_GRAMMY_DIR"))
      dir = d;
    auto node = find_on_path("node");
    if (node.empty()) {
      why = "node is not on PATH";
      return std::nullopt;
    }
    std::error_code ec;
    if (!fs::is_directory(dir / "node_modules" / "grammy", ec)) {
      why = fmt::format("{} is missing (run `npm ci --prefix benchmarks/grammy`)",
                        (dir / "node_modules" / "grammy").string());
      return std::nullopt;
    }
    auto script = (dir / "webhook_bot.js").string();
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      why = "pipe failed";
      return std::nullopt;
    }
    auto parent = ::getpid();
    auto pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      why = "fork failed";
      return std::nullopt;
    }
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent)
        ::_exit(127);
      ::dup2(fds[1], STDOUT_FILENO);
      const char* args[] = {node.c_str(), script.c_str(), "--port", "0", "--secret", secret,
                            "--path", "/telegram", nullptr};
      ::execv(node.c_str(), const_cast<char* const*>(args));
      ::_exit(127);
    }
    ::close(fds[1]);
    grammy_bot b{pid, fds[0]};
    b.port_ = b.wait_ready(std::chrono::seconds{20}, why);
    if (b.port_ == 0)
      return std::nullopt; // b's destructor stops the child
    return b;
  }

  grammy_bot(grammy_bot&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), out_(std::exchange(o.out_, -1)), port_(o.port_) {
    // nop
  }
  grammy_bot& operator=(grammy_bot&&) = delete;

  ~grammy_bot() {
    stop();
  }

  std::uint16_t port() const {
    return port_;
  }

  /// Whether the child is still running.
  bool alive() {
    if (pid_ <= 0)
      return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

  void stop() {
    if (out_ >= 0) {
      ::close(out_);
      out_ = -1;
    }
    if (pid_ <= 0)
      return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) { // up to 2 s, then SIGKILL
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  grammy_bot(pid_t pid, int out) : pid_(pid), out_(out) {
    // nop
  }

  static std::string find_on_path(const char* name) {
    const char* path = std::getenv("PATH");
    std::string_view rest = path ? path : "/usr/local/bin:/usr/bin:/bin";
    while (true) {
      auto colon = rest.find(':');
      auto d = rest.substr(0, colon);
      auto candidate = fmt::format("{}/{}", d.empty() ? "." : d, name);
      if (::access(candidate.c_str(), X_OK) == 0)
        return candidate;
      if (colon == std::string_view::npos)
        return {};
      rest.remove_prefix(colon + 1);
    }
  }

  // Reads the child's stdout up to its "ready <port>" line.
  std::uint16_t wait_ready(std::chrono::milliseconds timeout, std::string& why) {
    std::string got;
    auto deadline = steady::now() + timeout;
    while (true) {
      if (auto nl = got.find('\n'); nl != std::string::npos) {
        unsigned port = 0;
        if (std::sscanf(got.c_str(), "ready %u", &port) == 1 && port > 0 && port < 65536)
          return static_cast<std::uint16_t>(port);
        why = fmt::format("unexpected first line from webhook_bot.js: {}", got.substr(0, nl));
        return 0;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (left.count() <= 0) {
        why = "webhook_bot.js printed no ready line in time";
        return 0;
      }
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        continue;
      char buf[256];
      auto n = ::read(out_, buf, sizeof buf);
      if (n <= 0) {
        why = "webhook_bot.js exited before it was ready";
        return 0;
      }
      got.append(buf, static_cast<std::size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::uint16_t port_ = 0;
};

// -- load generator -----------------------------------------------------------

std::string update_body(std::int64_t update_id, int chat) {
  // ~1 KB like a real private-chat text update (names, entities, padding text).
  static const std::string filler(700, 'a');
  return fmt::format(
    R"({{"update_id":{},"message":{{"message_id":{},"from":{{"id":{},"is_bot":false,"first_name":"Ana","last_name":"García","username":"ana_{}","language_code":"es"}},"chat":{{"id":{},"first_name":"Ana","last_name":"García","username":"ana_{}","type":"private"}},"date":1700000000,"text":"hola {}"}}}})",
    update_id, update_id, 100000 + chat, chat, 100000 + chat, chat, filler);
}

struct round_result {
  double rps = 0;
  double p50_us = 0;
  double p99_us = 0;
  std::uint64_t errors = 0;
};

class load_generator {
 public:
  load_generator(std::uint16_t port, std::string path, std::size_t connections)
    : port_(port), path_(std::move(path)), conns_(connections) {
    // nop
  }

  round_result run(std::chrono::milliseconds warmup, std::chrono::milliseconds measure,
                   std::atomic<std::int64_t>& next_update) {
    next_update_ = &next_update;
    measuring_ = false;
    stop_ = false;
    latencies_.clear();
    latencies_.reserve(1 << 20);
    completed_ = 0;
    errors_ = 0;
    for (std::size_t i = 0; i < conns_; ++i) {
      auto c = std::make_shared<conn>(ioc_);
      c->sock.connect(tcp::endpoint{net::ip::make_address("127.0.0.1"), port_});
      c->sock.set_option(tcp::no_delay{true});
      all_.push_back(c);
      send(c);
    }
    net::steady_timer t{ioc_};
    steady::time_point start;
    t.expires_after(warmup);
    t.async_wait([&](beast::error_code) {
      measuring_ = true;
      start = steady::now();
      t.expires_after(measure);
      t.async_wait([&](beast::error_code) {
        stop_ = true;
        measuring_ = false;
      });
    });
    ioc_.run();
    auto secs = std::chrono::duration<double>(measure).count();
    ioc_.restart();
    all_.clear();
    round_result r;
    r.rps = static_cast<double>(completed_) / secs;
    r.errors = errors_;
    if (!latencies_.empty()) {
      std::sort(latencies_.begin(), latencies_.end());
      r.p50_us = latencies_[latencies_.size() / 2];
      r.p99_us = latencies_[latencies_.size() * 99 / 100];
    }
    return r;
  }

 private:
  struct conn {
    explicit conn(net::io_context& ioc) : sock(ioc) {
      // nop
    }
    tcp::socket sock;
    std::string out;
    std::string in;
    steady::time_point sent;
  };

  // Whether `in` holds one whole HTTP/1.1 response: a Content-Length body
  // (header names in any case) or a chunked body (Node's http server sends
  // one when the handler writes its head before the body).
  static bool response_complete(const std::string& in) {
    auto end = in.find("\r\n\r\n");
    if (end == std::string::npos)
      return false;
    std::string_view head{in.data(), end + 2};
    auto header = [&](std::string_view name) -> std::optional<std::string_view> {
      for (std::size_t at = head.find("\r\n"); at != std::string_view::npos;) {
        auto line_end = head.find("\r\n", at + 2);
        if (line_end == std::string_view::npos)
          break;
        auto line = head.substr(at + 2, line_end - at - 2);
        if (line.size() > name.size() && line[name.size()] == ':' &&
            std::equal(name.begin(), name.end(), line.begin(), [](char a, char b) {
              return std::tolower(static_cast<unsigned char>(a)) ==
                     std::tolower(static_cast<unsigned char>(b));
            })) {
          auto v = line.substr(name.size() + 1);
          while (!v.empty() && v.front() == ' ')
            v.remove_prefix(1);
          return v;
        }
        at = line_end;
      }
      return std::nullopt;
    };
    auto body = end + 4;
    if (auto te = header("transfer-encoding"); te && te->find("chunked") != std::string_view::npos) {
      // Chunks: hex size line, data, CRLF; a zero-size chunk and CRLF end it
      // (no trailers here).
      for (auto at = body;;) {
        auto line_end = in.find("\r\n", at);
        if (line_end == std::string::npos)
          return false;
        auto size = std::strtoul(in.c_str() + at, nullptr, 16);
        if (size == 0)
          return in.size() >= line_end + 4;
        at = line_end + 2 + size + 2;
        if (in.size() < at)
          return false;
      }
    }
    std::size_t len = 0;
    if (auto cl = header("content-length"))
      std::from_chars(cl->data(), cl->data() + cl->size(), len);
    return in.size() >= body + len;
  }

  void send(const std::shared_ptr<conn>& c) {
    if (stop_) {
      beast::error_code ec;
      c->sock.close(ec);
      return;
    }
    auto id = ++*next_update_;
    auto body = update_body(id, static_cast<int>(id % chats));
    c->out = fmt::format("POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         "application/json\r\nX-Telegram-Bot-Api-Secret-Token: "
                         "{}\r\nContent-Length: {}\r\n\r\n{}",
                         path_, secret, body.size(), body);
    c->in.clear();
    c->sent = steady::now();
    net::async_write(c->sock, net::buffer(c->out),
                     [this, c](beast::error_code ec, std::size_t) {
                       if (ec) {
                         ++errors_;
                         return;
                       }
                       read(c);
                     });
  }

  void read(const std::shared_ptr<conn>& c) {
    auto old = c->in.size();
    c->in.resize(old + 4096);
    c->sock.async_read_some(
      net::buffer(c->in.data() + old, 4096),
      [this, c, old](beast::error_code ec, std::size_t n) {
        if (ec) {
          ++errors_;
          return;
        }
        c->in.resize(old + n);
        if (!response_complete(c->in))
          return read(c);
        if (!c->in.starts_with("HTTP/1.1 200"))
          ++errors_;
        if (measuring_) {
          ++completed_;
          latencies_.push_back(
            std::chrono::duration<double, std::micro>(steady::now() - c->sent).count());
        }
        send(c);
      });
  }

  net::io_context ioc_{1};
  std::uint16_t port_;
  std::string path_;
  std::size_t conns_;
  std::vector<std::shared_ptr<conn>> all_;
  std::atomic<std::int64_t>* next_update_ = nullptr;
  bool measuring_ = false;
  bool stop_ = false;
  std::vector<double> latencies_;
  std::uint64_t completed_ = 0;
  std::uint64_t errors_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

int run(int argc, char** argv) {
  int rounds = 5;
  double seconds = 2;
  std::size_t threads = 1;
  std::size_t connections = 40;
  bool with_grammy = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (a == "--threads")
      threads = static_cast<std::size_t>(std::atoi(argv[i + 1]));
    else if (a == "--connections")
      connections = static_cast<std::size_t>(std::atoi(argv[i + 1]));
    else if (a == "--grammy")
      with_grammy = std::atoi(argv[i + 1]) != 0;
  }
  auto measure = std::chrono::milliseconds{static_cast<int>(seconds * 1000)};
  auto warmup = std::chrono::milliseconds{500};

  // The node child is forked before this process starts any thread.
  std::string why = "--grammy 0";
  auto grammy = with_grammy ? grammy_bot::start(why) : std::nullopt;
  if (!grammy)
    std::printf("# grammy: not measured: %s\n", why.c_str());
  std::fflush(stdout);

  hello_server hello{threads};

  botmesh::telegram::webhook_options o;
  o.token = "1:bench";
  o.api_url = "http://127.0.0.1:9"; // never called: replies go in the webhook
  o.secret_token = secret;
  o.reply_in_webhook = true;
  o.listen.io_threads = threads;
  o.flood = botmesh::http::flood_limits::none();
  auto provider = std::make_shared<botmesh::telegram::webhook_provider>(o);
  // The bot owns its actor system, set up as configure_scheduler says.
  botmesh::bot bot{{.provider = provider, .log_messages = false}};
  bot.on_message([](botmesh::context& c) { c.reply("ok"); });
  bot.start();

  std::atomic<std::int64_t> next_update{0};
  if (grammy) {
    // V8 compiles the bot's hot paths while it runs: without a pass that
    // is not counted, the first round measures the compiler.
    try {
      load_generator ref{grammy->port(), "/telegram", connections};
      auto g = ref.run(warmup, std::chrono::seconds{3}, next_update);
      std::fprintf(stderr, "grammy warm-up (not counted): %.0f req/s\n", g.rps);
    } catch (const std::exception& e) {
      std::printf("# grammy: not measured: warm-up: %s\n", e.what());
      grammy.reset();
    }
  }
  std::vector<double> rps_ratio, p99_ratio, grammy_rps_ratio, grammy_p99_ratio;
  std::vector<round_result> hello_rounds, hook_rounds, grammy_rounds;
  for (int r = 0; r < rounds; ++r) {
    load_generator base{hello.port(), "/telegram", connections};
    auto b = base.run(warmup, measure, next_update);
    load_generator hook{provider->server().port(), "/telegram", connections};
    auto w = hook.run(warmup, measure, next_update);
    hello_rounds.push_back(b);
    hook_rounds.push_back(w);
    if (b.rps > 0)
      rps_ratio.push_back(w.rps / b.rps);
    if (b.p99_us > 0)
      p99_ratio.push_back(w.p99_us / b.p99_us);
    std::fprintf(stderr,
                 "round %d: beast %.0f req/s p50 %.0f us p99 %.0f us | webhook "
                 "%.0f req/s p50 %.0f us p99 %.0f us (errors %llu/%llu)\n",
                 r + 1, b.rps, b.p50_us, b.p99_us, w.rps, w.p50_us, w.p99_us,
                 static_cast<unsigned long long>(b.errors),
                 static_cast<unsigned long long>(w.errors));
    if (!grammy)
      continue;
    try {
      if (!grammy->alive())
        throw std::runtime_error("webhook_bot.js exited");
      load_generator ref{grammy->port(), "/telegram", connections};
      auto g = ref.run(warmup, measure, next_update);
      if (g.errors > 0)
        throw std::runtime_error(fmt::format("{} failed requests", g.errors));
      grammy_rounds.push_back(g);
      if (g.rps > 0)
        grammy_rps_ratio.push_back(w.rps / g.rps);
      if (g.p99_us > 0)
        grammy_p99_ratio.push_back(w.p99_us / g.p99_us);
      std::fprintf(stderr, "round %d: grammy %.0f req/s p50 %.0f us p99 %.0f us (errors %llu)\n",
                   r + 1, g.rps, g.p50_us, g.p99_us, static_cast<unsigned long long>(g.errors));
    } catch (const std::exception& e) {
      std::printf("# grammy: not measured: round %d: %s\n", r + 1, e.what());
      grammy.reset();
      grammy_rounds.clear();
      grammy_rps_ratio.clear();
      grammy_p99_ratio.clear();
    }
  }
  grammy.reset(); // stops the child
  auto med = [](const std::vector<round_result>& v, double round_result::*f) {
    std::vector<double> x;
    for (auto& r : v)
      x.push_back(r.*f);
    return median(x);
  };
  std::printf("bench beast_hello_rps %.0f req/s\n", med(hello_rounds, &round_result::rps));
  std::printf("bench beast_hello_p50 %.0f us\n", med(hello_rounds, &round_result::p50_us));
  std::printf("bench beast_hello_p99 %.0f us\n", med(hello_rounds, &round_result::p99_us));
  std::printf("bench webhook_rps %.0f req/s\n", med(hook_rounds, &round_result::rps));
  std::printf("bench webhook_p50 %.0f us\n", med(hook_rounds, &round_result::p50_us));
  std::printf("bench webhook_p99 %.0f us\n", med(hook_rounds, &round_result::p99_us));
  std::printf("ratio webhook_vs_beast_rps %.2f\n", median(rps_ratio));
  std::printf("ratio webhook_vs_beast_p99 %.2f\n", median(p99_ratio));
  if (!grammy_rounds.empty()) {
    std::printf("bench grammy_webhook_rps %.0f req/s\n", med(grammy_rounds, &round_result::rps));
    std::printf("bench grammy_webhook_p50 %.2f ms\n",
                med(grammy_rounds, &round_result::p50_us) / 1000);
    std::printf("bench grammy_webhook_p99 %.2f ms\n",
                med(grammy_rounds, &round_result::p99_us) / 1000);
    std::printf("ratio webhook_vs_grammy_rps %.2f\n", median(grammy_rps_ratio));
    std::printf("ratio webhook_vs_grammy_p99 %.2f\n", median(grammy_p99_ratio));
  }
  auto s = bot.stats();
  std::fprintf(stderr, "handled %llu, refused %llu, in-webhook replies %llu\n",
               static_cast<unsigned long long>(s.handled),
               static_cast<unsigned long long>(s.refused_overload + s.refused_stopped),
               static_cast<unsigned long long>(provider->stats().replies_in_webhook));
  bot.stop();
  return 0;
}

int main(int argc, char** argv) {
  // Caught here so that destructors (the node child's among them) run.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_webhook: %s\n", e.what());
    return 1;
  }
}
