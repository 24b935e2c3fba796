#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <caf/all.hpp>

#include <conformance/schedule_store_conformance.hpp>
#include <conformance/store_conformance.hpp>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/metrics.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_pause.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;

namespace {

std::shared_ptr<botmesh::redis_client> shared_client() {
  static auto c = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = test::redis_url()});
  return c;
}

struct redis_store_factory {
  std::shared_ptr<botmesh::store> make() {
    auto s = std::make_shared<botmesh::redis_store>(botmesh::redis_store_options{
      .client = shared_client(), .prefix = test::unique_prefix()});
    s->start();
    return s;
  }

  // TTLs run on the server's clock: let real time pass.
  void advance(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
  }
};

struct redis_schedule_store_factory {
  std::shared_ptr<botmesh::schedule_store> make() {
    botmesh::redis_store s{{.client = shared_client(),
                            .prefix = test::unique_prefix()}};
    return s.schedules();
  }
};

botmesh::errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const botmesh::error& e) {
    return e.code();
  }
  return botmesh::errc::none;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

} // namespace

TYPE_TO_STRING(redis_store_factory);
TYPE_TO_STRING(redis_schedule_store_factory);
BOTMESH_STORE_CONFORMANCE(redis_store_factory);
BOTMESH_SCHEDULE_STORE_CONFORMANCE(redis_schedule_store_factory);
BOTMESH_ASYNC_SCHEDULE_STORE_CONFORMANCE(redis_schedule_store_factory);

TEST_CASE("Redis URLs are parsed and a malformed one names the url field") {
  for (auto bad : {"http://localhost:6379", "redis://", "redis://host:0",
                   "redis://host:99999", "redis://host:port", "redis://h:1/x"}) {
    CAPTURE(bad);
    try {
      botmesh::redis_client c{{.url = bad}};
      FAIL("accepted a malformed URL");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "url");
      CHECK(std::string{e.what()}.find(bad) != std::string::npos);
    }
  }
}

TEST_CASE("a server error reply becomes a typed error naming the command") {
  auto c = shared_client();
  auto key = test::unique_prefix() + ":text";
  c->call({"SET", key, "not a number"});
  auto what = what_of([&] { c->call({"INCR", key}); });
  CHECK(what.find("INCR") != std::string::npos);
  CHECK(what.find("not an integer") != std::string::npos);
  CHECK(code_of([&] { c->call({"NOSUCHCOMMAND"}); })
        == botmesh::errc::store_error);
  auto raw = c->call_raw({"NOSUCHCOMMAND"});
  CHECK(raw.type == botmesh::redis_reply::kind::error);
  // The connection keeps working after error replies.
  CHECK(c->call({"GET", key}).str == "not a number");
  c->call({"DEL", key});
}

TEST_CASE("64 concurrent callers share pipelined connections and each gets "
          "its own reply") {
  auto c = shared_client();
  auto key = test::unique_prefix() + ":counter";
  constexpr int callers = 64;
  constexpr int per_caller = 100;
  std::vector<std::vector<std::int64_t>> seen(callers);
  std::vector<std::thread> pool;
  for (int t = 0; t < callers; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_caller; ++i)
        seen[t].push_back(c->call({"INCR", key}).integer);
    });
  for (auto& th : pool)
    th.join();
  std::set<std::int64_t> all;
  for (auto& v : seen) {
    CHECK(std::is_sorted(v.begin(), v.end())); // per caller, in order
    all.insert(v.begin(), v.end());
  }
  CHECK(all.size() == callers * per_caller); // no reply went to two callers
  CHECK(*all.rbegin() == callers * per_caller);
  c->call({"DEL", key});
}

TEST_CASE("scripts run by SHA and fall back to EVAL after SCRIPT FLUSH") {
  auto c = shared_client();
  botmesh::redis_store s{{.client = c, .prefix = test::unique_prefix()}};
  auto a = s.acquire_lock_fenced("k", 10s);
  REQUIRE(a);
  c->call({"SCRIPT", "FLUSH"});
  CHECK(s.release_lock("k", a->token));
  auto b = s.acquire_lock_fenced("k", 10s);
  REQUIRE(b);
  CHECK(b->fence > a->fence);
}

TEST_CASE("an asynchronous script call meeting NOSCRIPT runs by EVAL with "
          "its keys and arguments") {
  // A body the server has never seen, and no preload: the EVALSHA meets
  // NOSCRIPT and the fallback rebuilds the call from the sent command.
  auto nonce = test::unique_prefix("noscript");
  botmesh::redis_script script{
    "echo", "#!lua\n-- " + nonce + "\nreturn {KEYS[1], ARGV[1], ARGV[2]}\n"};
  botmesh::redis_client c{{.url = test::redis_url(), .connections = 1}};
  for (int round = 0; round < 2; ++round) { // then it is cached: EVALSHA
    std::promise<botmesh::redis_reply> got;
    c.eval_async(nonce, script, {nonce + ":k"}, {"a", std::string(300, 'x')},
                 [&](botmesh::redis_reply r, std::exception_ptr e) {
                   if (e)
                     got.set_exception(e);
                   else
                     got.set_value(std::move(r));
                 });
    auto r = got.get_future().get();
    REQUIRE(r.type == botmesh::redis_reply::kind::array);
    REQUIRE(r.elements.size() == 3);
    CHECK(r.elements[0].str == nonce + ":k");
    CHECK(r.elements[1].str == "a");
    CHECK(r.elements[2].str == std::string(300, 'x'));
  }
}

TEST_CASE("a script preloaded after its connection opened runs in the order "
          "it was sent, ahead of a later command of the same key") {
  // A body no server has seen yet: its EVALSHA would meet NOSCRIPT, and the
  // EVAL fallback would go behind the SET sent after it.
  auto nonce = test::unique_prefix("order");
  botmesh::redis_script script{
    "order", "#!lua\n-- " + nonce + "\nredis.call('SET', KEYS[1], '1')\n"
             "return 1\n"};
  botmesh::redis_client c{{.url = test::redis_url(), .connections = 1}};
  auto key = nonce + ":k";
  c.call({"PING"}); // the connection is open before the preload
  c.preload(script);
  std::promise<botmesh::redis_reply> first;
  std::promise<void> second;
  c.eval_async(key, script, {key}, {},
               [&](botmesh::redis_reply r, std::exception_ptr) {
                 first.set_value(std::move(r));
               });
  c.async(key, {"SET", key, "2"},
          [&](botmesh::redis_reply, std::exception_ptr) { second.set_value(); });
  auto r = first.get_future().get();
  second.get_future().wait();
  CHECK(r.type == botmesh::redis_reply::kind::integer);
  CHECK(c.call({"GET", key}).str == "2");
  c.call({"DEL", key});
}

TEST_CASE("a script preloaded while a caller's MULTI block is open is loaded "
          "after its EXEC, not inside the transaction") {
  auto nonce = test::unique_prefix("multi");
  botmesh::redis_script script{
    "multi", "#!lua\n-- " + nonce + "\nreturn 7\n"};
  botmesh::redis_client c{{.url = test::redis_url(), .connections = 1}};
  auto key = nonce + ":k";
  CHECK(c.call({"MULTI"}).str == "OK");
  c.preload(script);
  CHECK(c.call({"SET", key, "x"}).str == "QUEUED");
  auto exec = c.call({"EXEC"});
  REQUIRE(exec.type == botmesh::redis_reply::kind::array);
  CHECK(exec.elements.size() == 1); // the SET's answer alone
  CHECK(c.eval(script, {key}, {}).integer == 7);
  c.call({"DEL", key});
}

TEST_CASE("the database in the URL is selected") {
  auto url = test::redis_url();
  botmesh::redis_client db0{{.url = url}};
  botmesh::redis_client db3{{.url = url + "/3"}};
  auto key = test::unique_prefix() + ":db";
  db3.call({"SET", key, "three"});
  CHECK(db0.call({"GET", key}).is_nil());
  CHECK(db3.call({"GET", key}).str == "three");
  db3.call({"DEL", key});
}

TEST_CASE("corrupted records read back as errors naming the key") {
  auto c = shared_client();
  auto prefix = test::unique_prefix();
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  botmesh::flow_checkpoint cp;
  cp.key = "test:x";
  cp.flow = "pedido";
  REQUIRE(s.set_checkpoint_if(cp, 0));
  c->call({"HSET", prefix + ":cp:test:x", "body", "{garbage"});
  auto what = what_of([&] { s.get_checkpoint("test:x"); });
  CHECK(code_of([&] { s.get_checkpoint("test:x"); })
        == botmesh::errc::corrupted_record);
  CHECK(what.find(prefix + ":cp:test:x") != std::string::npos);
  // With its revision, so a clear of it can be conditional.
  std::optional<std::uint64_t> damaged_at;
  try {
    s.get_checkpoint("test:x");
  } catch (const botmesh::corrupted_checkpoint_error& e) {
    damaged_at = e.revision();
  }
  CHECK(damaged_at == std::optional<std::uint64_t>{1});
  CHECK_FALSE(s.clear_checkpoint_if("test:x", 2));
  CHECK(s.clear_checkpoint_if("test:x", 1));
  CHECK_FALSE(s.get_checkpoint("test:x").has_value());
  // The chat can go on: a new write replaces the broken record.
  auto rev = s.set_checkpoint(cp);
  CHECK(s.get_checkpoint("test:x")->revision == rev);
  // A damaged revision: cleared only while it is unreadable.
  c->call({"HSET", prefix + ":cp:test:x", "rev", "abc"});
  CHECK(code_of([&] { s.get_checkpoint("test:x"); })
        == botmesh::errc::corrupted_record);
  REQUIRE(s.set_checkpoint_if(cp, 0)); // (read as no live checkpoint)
  CHECK_FALSE(s.clear_damaged_checkpoint("test:x")); // readable now
  REQUIRE(s.get_checkpoint("test:x"));
  // Whatever the store cannot read is damaged, also what Lua's tonumber
  // would take (a point, an exponent, a sign, hex, past 64 bits).
  for (auto bad : {"1.5", "7.0", "7e0", "+7", "0x7", " 7", "-1",
                   "9223372036854775808", "99999999999999999999"}) {
    CAPTURE(bad);
    REQUIRE(s.set_checkpoint(cp));
    c->call({"HSET", prefix + ":cp:test:x", "rev", bad});
    CHECK(code_of([&] { s.get_checkpoint("test:x"); })
          == botmesh::errc::corrupted_record);
    CHECK(s.clear_damaged_checkpoint("test:x"));
  }
  REQUIRE(s.set_checkpoint(cp));
  for (auto good : {"7", "007", "9223372036854775807"}) {
    CAPTURE(good);
    c->call({"HSET", prefix + ":cp:test:x", "rev", good});
    CHECK(s.get_checkpoint("test:x").has_value());
    CHECK_FALSE(s.clear_damaged_checkpoint("test:x"));
  }
  c->call({"HDEL", prefix + ":cp:test:x", "rev"});
  CHECK(s.clear_damaged_checkpoint("test:x"));
  CHECK_FALSE(s.get_checkpoint("test:x").has_value());
  CHECK_FALSE(s.clear_damaged_checkpoint("test:x")); // (none left)
  rev = s.set_checkpoint(cp);
  auto sched = s.schedules();
  sched->register_task("job", "every 1000", botmesh::from_unix_ms(1),
                       botmesh::from_unix_ms(0));
  c->call({"HSET", prefix + ":sched:job", "next", "soon"});
  what = what_of([&] { sched->get("job"); });
  CHECK(what.find("\"next\" is not an integer") != std::string::npos);
  // A time out of range (years 1-9999) is damage too, not a slot to plan.
  c->call({"HSET", prefix + ":sched:job", "next", "-9223372036854775807"});
  what = what_of([&] { sched->get("job"); });
  CHECK(what.find(prefix + ":sched:job") != std::string::npos);
  CHECK(what.find("\"next_run_at\"") != std::string::npos);
  CHECK(code_of([&] {
          sched->claim("job", "me", botmesh::from_unix_ms(5), 1000ms);
        })
        == botmesh::errc::corrupted_record);
  // A negative fencing token: named, never cast to a huge one that no
  // renewal or commit would match.
  c->call({"HSET", prefix + ":sched:job", "next", "1", "token", "-5"});
  what = what_of([&] { sched->get("job"); });
  CHECK(what.find("\"token\" is negative: -5") != std::string::npos);
  CHECK(code_of([&] { sched->get("job"); }) == botmesh::errc::corrupted_record);
  c->call({"RPUSH", prefix + ":log:test:x", "not json"});
  CHECK(code_of([&] { s.messages("test:x", 10); })
        == botmesh::errc::corrupted_record);
}

TEST_CASE("a lock whose fence counter is damaged is refused naming the "
          "counter, and is not left taken") {
  auto c = shared_client();
  auto prefix = test::unique_prefix();
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  auto counter = prefix + ":fence:test:l";
  // Not an integer, at its limit, negative.
  for (std::string bad : {"abc", "9223372036854775807", "-5"}) {
    CAPTURE(bad);
    c->call({"SET", counter, bad});
    auto what = what_of([&] { s.acquire_lock_fenced("test:l", 5s); });
    CHECK(what.find(counter) != std::string::npos);
    CHECK(c->call({"EXISTS", prefix + ":lock:test:l"}).integer == 0);
  }
  c->call({"SET", counter, "41"});
  auto lock = s.acquire_lock_fenced("test:l", 5s);
  REQUIRE(lock);
  CHECK(lock->fence == 42);
  c->call({"DEL", counter, prefix + ":lock:test:l"});
}

TEST_CASE("Redis counters from 1e14 are written as integers, and one a Lua "
          "number cannot hold is refused naming its key, losing nothing") {
  auto c = shared_client();
  auto prefix = test::unique_prefix();
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  // A checkpoint revision from 1e14 goes on as an integer.
  botmesh::flow_checkpoint cp;
  cp.key = "test:big";
  cp.flow = "pedido";
  auto rev_key = prefix + ":cprev:test:big";
  c->call({"SET", rev_key, "99999999999999"});
  auto rev = s.set_checkpoint(cp);
  CHECK(rev == 100000000000000);
  CHECK(c->call({"GET", rev_key}).str == "100000000000000");
  REQUIRE(s.get_checkpoint("test:big"));
  CHECK(s.get_checkpoint("test:big")->revision == rev);
  for (std::string bad : {"9007199254740991", "abc", "-3"}) {
    CAPTURE(bad);
    c->call({"SET", rev_key, bad});
    auto what = what_of([&] { s.set_checkpoint(cp); });
    CHECK(what.find(rev_key) != std::string::npos);
    CHECK(s.get_checkpoint("test:big")->revision == rev);
  }
  // A live revision past the counter, and damaged: named too.
  c->call({"SET", rev_key, "5"});
  c->call({"HSET", prefix + ":cp:test:big", "rev", "9007199254740991"});
  auto live = what_of([&] { s.set_checkpoint(cp); });
  CHECK(live.find(prefix + ":cp:test:big") != std::string::npos);
  CHECK(c->call({"GET", rev_key}).str == "5");
  // A message log's seq.
  auto seq_key = prefix + ":logseq:test:big";
  botmesh::logged_message m;
  m.id = "m1";
  m.text = "hola";
  c->call({"SET", seq_key, "99999999999999"});
  CHECK(s.append_message("test:big", m) == 100000000000000);
  auto log = s.messages("test:big", 10);
  REQUIRE(log.size() == 1);
  CHECK(log[0].seq == 100000000000000);
  c->call({"SET", seq_key, "9007199254740991"});
  auto what = what_of([&] { s.append_message("test:big", m); });
  CHECK(what.find(seq_key) != std::string::npos);
  CHECK(s.messages("test:big", 10).size() == 1);
  CHECK(c->call({"GET", seq_key}).str == "9007199254740991"); // not moved on
  c->call({"DEL", rev_key, seq_key, prefix + ":cp:test:big",
           prefix + ":log:test:big"});
}

TEST_CASE("deleting user data whose index is damaged says so, naming the "
          "index") {
  auto c = shared_client();
  auto prefix = test::unique_prefix();
  botmesh::redis_store s{{.client = c, .prefix = prefix}};
  s.set_user_data("u1", "prefs", "lang", R"("es")");
  auto index = prefix + ":udidx:u1:prefs";
  c->call({"DEL", index});
  c->call({"SET", index, "not a sorted set"});
  auto what = what_of([&] { s.delete_user_data("u1", "prefs", "lang"); });
  CHECK(what.find(index) != std::string::npos);
  CHECK(what.find("WRONGTYPE") != std::string::npos);
  c->call({"DEL", index});
}

TEST_CASE("an unreachable server fails fast with a typed error") {
  botmesh::redis_client c{{.url = "redis://127.0.0.1:" + std::to_string(test::free_port()),
                           .connect_timeout = "500ms"}};
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i)
    CHECK(code_of([&] { c.call({"PING"}); }) == botmesh::errc::store_error);
  // Twenty commands while down did not wait twenty connect timeouts.
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(what_of([&] { c.call({"PING"}); }).find("127.0.0.1") != std::string::npos);
}

TEST_CASE("the client reconnects after the server restarts") {
  test::redis_process server;
  botmesh::redis_client c{{.url = server.url(), .connections = 1}};
  c.call({"SET", "k", "before"});
  server.kill();
  CHECK(code_of([&] { c.call({"GET", "k"}); }) == botmesh::errc::store_error);
  CHECK(code_of([&] { c.call({"GET", "k"}); }) == botmesh::errc::store_error);
  server.start(); // returns once the server answers PING
  // The first command after the server is back reconnects on demand: a
  // refused attempt left no backoff to sit out.
  c.call({"SET", "k", "after"});
  CHECK(c.call({"GET", "k"}).str == "after");
}

TEST_CASE("a connection the server closed while idle is replaced before the "
          "next command") {
  test::redis_process server;
  botmesh::redis_client c{{.url = server.url(), .connections = 1}};
  c.call({"SET", "k", "v"});
  // Restarted while the client sent nothing: its socket is dead.
  server.kill();
  server.start();
  std::this_thread::sleep_for(150ms); // idle long enough to be checked
  CHECK(c.call({"PING"}).str == "PONG");
}

TEST_CASE("a reply announcing a huge array fails the command instead of "
          "allocating it") {
  // A fake server that answers anything with a header of 1,000,000,041
  // elements (8 GB of pointers in hiredis 0.14).
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto port = ntohs(addr.sin_port);
  std::thread fake{[lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0)
      return;
    char buf[512];
    if (::read(fd, buf, sizeof(buf)) > 0) {
      const char reply[] = "*1000000041\r\n";
      (void) !::write(fd, reply, sizeof(reply) - 1);
    }
    // Hold the connection until the client gives it up.
    while (::read(fd, buf, sizeof(buf)) > 0) {
    }
    ::close(fd);
  }};
  {
    botmesh::redis_client c{{.url = "redis://127.0.0.1:" + std::to_string(port),
                             .command_timeout = "500ms",
                             .connections = 1}};
    auto what = what_of([&] { c.call({"LRANGE", "k", "0", "-1"}); });
    CHECK(what.find("1000000041 elements") != std::string::npos);
    // The connection was dropped, not reused in an unknown state.
    CHECK(code_of([&] { c.call({"PING"}); }) != botmesh::errc::none);
  }
  ::shutdown(lfd, SHUT_RDWR);
  ::close(lfd);
  fake.join();
}

TEST_CASE("a command queued while another waits for its reply is written "
          "at once (pipelined, not behind that reply)") {
  // A fake server that answers only once it has read two commands: a client
  // that writes the second after the first's reply never gets either.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto port = ntohs(addr.sin_port);
  std::thread fake{[lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0)
      return;
    std::string got;
    char buf[512];
    auto commands = [&] {
      std::size_t n = 0;
      for (auto p = got.find("PING"); p != std::string::npos;
           p = got.find("PING", p + 1))
        ++n;
      return n;
    };
    while (commands() < 2) {
      auto n = ::read(fd, buf, sizeof(buf));
      if (n <= 0)
        break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    const char reply[] = "+ONE\r\n+TWO\r\n";
    (void) !::write(fd, reply, sizeof(reply) - 1);
    while (::read(fd, buf, sizeof(buf)) > 0) {
    }
    ::close(fd);
  }};
  {
    botmesh::redis_client c{{.url = "redis://127.0.0.1:" + std::to_string(port),
                             .command_timeout = "3s",
                             .connections = 1}};
    std::promise<std::string> first;
    std::promise<std::string> second;
    auto f1 = first.get_future();
    auto f2 = second.get_future();
    auto put = [](std::promise<std::string>& p) {
      return [&p](botmesh::redis_reply r, std::exception_ptr e) {
        p.set_value(e ? std::string{"error"} : r.str);
      };
    };
    c.async({"PING"}, put(first));
    // Let the first go out alone before the second is queued.
    std::this_thread::sleep_for(50ms);
    c.async({"PING"}, put(second));
    CHECK(f1.get() == "ONE");
    CHECK(f2.get() == "TWO");
  }
  ::shutdown(lfd, SHUT_RDWR);
  ::close(lfd);
  fake.join();
}

TEST_CASE("a reconnection whose script load gets no answer is not taken as "
          "connected: the command behind it fails as not sent, naming the load") {
  test::redis_process server;
  botmesh::redis_client c{{.url = server.url(), .command_timeout = "300ms",
                           .connections = 1, .max_backoff = "100ms"}};
  static const botmesh::redis_script probe{"probe_load", "#!lua\nreturn 1"};
  c.preload(probe);
  REQUIRE(c.call({"PING"}).str == "PONG");
  botmesh::redis_client admin{{.url = server.url(), .connections = 1}};
  // c's connection is dropped; c notices when it next sends (idle for
  // more than 100 ms) and connects anew...
  admin.call({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  std::this_thread::sleep_for(150ms);
  // ...to a server that accepts (the kernel does) but answers nothing.
  std::jthread sleeper{[&] {
    botmesh::redis_client a{{.url = server.url(), .connections = 1}};
    a.call({"DEBUG", "SLEEP", "1.5"});
  }};
  REQUIRE(test::await_unresponsive(server.url()));
  std::string what;
  auto code = botmesh::errc::none;
  try {
    c.call({"GET", "k"});
  } catch (const botmesh::error& e) {
    code = e.code();
    what = e.what();
  }
  sleeper.join();
  CAPTURE(what);
  // Not sent: not errc::timeout, which says the command may have run.
  CHECK(code == botmesh::errc::store_error);
  CHECK(what.find("loading script probe_load") != std::string::npos);
  bool ok = false;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!ok && std::chrono::steady_clock::now() < deadline) {
    try {
      ok = c.eval(probe, {}, {}).integer == 1;
    } catch (const botmesh::error&) {
      std::this_thread::sleep_for(20ms);
    }
  }
  CHECK(ok);
}

TEST_CASE("a reply slower than the command timeout fails with timeout and the "
          "connection recovers") {
  test::redis_process server;
  botmesh::redis_client c{{.url = server.url(), .command_timeout = "200ms",
                           .connections = 1, .max_backoff = "100ms"}};
  CHECK(code_of([&] { c.call({"DEBUG", "SLEEP", "1"}); })
        == botmesh::errc::timeout);
  bool ok = false;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!ok && std::chrono::steady_clock::now() < deadline) {
    try {
      ok = c.call({"PING"}).str == "PONG";
    } catch (const botmesh::error&) {
      std::this_thread::sleep_for(20ms);
    }
  }
  CHECK(ok);
}

namespace {

// Polls `pred` every 10 ms until it holds; false after `timeout`.
bool until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
  }
  return true;
}

} // namespace

TEST_CASE("a subscription on a server that stops answering is made anew "
          "once it answers again, and hears what is published then") {
  test::redis_process server;
  // Before the client: its subscription's thread writes them until the
  // client is gone.
  std::atomic<int> subscribed{0};
  std::mutex mtx;
  std::vector<std::string> heard;
  botmesh::redis_client c{{.url = server.url(), .command_timeout = "300ms",
                           .max_backoff = "100ms"}};
  c.subscribe(
    "bm-quiet",
    [&](std::string_view m) {
      std::lock_guard guard{mtx};
      heard.emplace_back(m);
    },
    [&] { ++subscribed; });
  REQUIRE(until([&] { return subscribed.load() == 1; }, 5s));
  // The server hangs for 2 s: the subscription's PING goes unanswered.
  std::thread sleeper{[&] {
    botmesh::redis_client admin{{.url = server.url()}};
    admin.call({"DEBUG", "SLEEP", "2"});
  }};
  sleeper.join();
  REQUIRE(until([&] { return subscribed.load() >= 2; }, 5s));
  botmesh::redis_client pub{{.url = server.url()}};
  REQUIRE(until(
    [&] {
      pub.call({"PUBLISH", "bm-quiet", "hola"});
      std::lock_guard guard{mtx};
      return !heard.empty();
    },
    5s));
  std::lock_guard guard{mtx};
  CHECK(heard.front() == "hola");
}

TEST_CASE("unsubscribe ends one subscription of a client, also from its own "
          "callback, and leaves the others") {
  test::redis_process server;
  // Before the client: its subscriptions' threads write them until the
  // client is gone.
  std::mutex mtx;
  std::vector<std::string> heard;
  std::atomic<int> subscribed{0};
  std::atomic<std::uint64_t> self_id{0};
  botmesh::redis_client c{{.url = server.url()}};
  auto hear = [&](std::string what) {
    std::lock_guard guard{mtx};
    heard.push_back(std::move(what));
  };
  auto gone = c.subscribe(
    "bm-gone", [&](std::string_view m) { hear("gone " + std::string{m}); },
    [&] { ++subscribed; });
  c.subscribe(
    "bm-kept", [&](std::string_view m) { hear("kept " + std::string{m}); },
    [&] { ++subscribed; });
  self_id = c.subscribe(
    "bm-self",
    [&](std::string_view m) {
      hear("self " + std::string{m});
      c.unsubscribe(self_id.load()); // its own thread: ends after this
    },
    [&] { ++subscribed; });
  REQUIRE(until([&] { return subscribed.load() == 3; }, 5s));
  botmesh::redis_client pub{{.url = server.url()}};
  auto numsub = [&](const char* channel) {
    return pub.call({"PUBSUB", "NUMSUB", channel}).elements.at(1).integer;
  };
  CHECK(numsub("bm-gone") == 1);
  c.unsubscribe(gone);
  // Its connection is closed once unsubscribe returns.
  CHECK(until([&] { return numsub("bm-gone") == 0; }, 5s));
  pub.call({"PUBLISH", "bm-self", "1"});
  CHECK(until([&] { return numsub("bm-self") == 0; }, 5s));
  pub.call({"PUBLISH", "bm-gone", "x"});
  pub.call({"PUBLISH", "bm-self", "2"});
  pub.call({"PUBLISH", "bm-kept", "y"});
  REQUIRE(until(
    [&] {
      std::lock_guard guard{mtx};
      return std::find(heard.begin(), heard.end(), "kept y") != heard.end();
    },
    5s));
  c.unsubscribe(12345678); // unknown: nothing
  CHECK(numsub("bm-kept") == 1);
  std::lock_guard guard{mtx};
  CHECK(heard == std::vector<std::string>{"self 1", "kept y"});
}

TEST_CASE("a lock whose acquire reply was lost is given back, not held by "
          "a token nobody has until its ttl") {
  test::redis_process server;
  auto c = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = server.url(), .command_timeout = "500ms"});
  botmesh::redis_store s{{.client = c, .prefix = "bmlk"}};
  REQUIRE(s.acquire_lock_fenced("test:other", 60s)); // scripts loaded
  // The server is busy for three seconds: the acquire is written, not
  // answered in time, and runs when the server wakes up. (Three, so that
  // a late sleeper thread still leaves the acquire inside the sleep.)
  botmesh::redis_client admin{{.url = server.url(), .command_timeout = "10s"}};
  REQUIRE(admin.call({"PING"}).str == "PONG");
  std::thread sleeper{[&] { admin.call({"DEBUG", "SLEEP", "3"}); }};
  std::this_thread::sleep_for(500ms);
  CHECK(code_of([&] { s.acquire_lock_fenced("test:l", 60s); })
        == botmesh::errc::timeout);
  sleeper.join();
  // It ran (it took fence 1), and the lock is free again well within its
  // 60 s ttl. Before, it stayed taken for the whole minute.
  CHECK(until([&] { return c->call({"EXISTS", "bmlk:lock:test:l"}).integer == 0; },
              10s));
  CHECK(c->call({"GET", "bmlk:fence:test:l"}).str == "1");
  auto lock = s.acquire_lock_fenced("test:l", 60s);
  REQUIRE(lock);
  CHECK(lock->fence == 2);
}

TEST_CASE("a client subscribed to a server that accepts and never answers "
          "is destroyed within its timeouts") {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(lfd, 16) == 0); // the kernel accepts; nobody answers
  socklen_t len = sizeof addr;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto url = "redis://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto gone = std::async(std::launch::async, [url] {
    botmesh::redis_client c{{.url = url, .command_timeout = "200ms",
                             .connect_timeout = "200ms",
                             .max_backoff = "100ms"}};
    c.subscribe("bm-never", [](std::string_view) {});
    std::this_thread::sleep_for(300ms);
  });
  CHECK(gone.wait_for(10s) == std::future_status::ready);
  ::close(lfd);
}

TEST_CASE("AUTH uses the password from the URL, a wrong one is a clear error") {
  test::redis_process server{"s3cret"};
  auto base = "127.0.0.1:" + std::to_string(server.port());
  botmesh::redis_client good{{.url = "redis://:s3cret@" + base}};
  CHECK(good.call({"PING"}).str == "PONG");
  botmesh::redis_client user{{.url = "redis://default:s3cret@" + base + "/2"}};
  CHECK(user.call({"PING"}).str == "PONG");
  botmesh::redis_client bad{{.url = "redis://:wrong@" + base}};
  auto what = what_of([&] { bad.call({"PING"}); });
  CHECK(what.find("AUTH failed") != std::string::npos);
  botmesh::redis_client none{{.url = "redis://" + base}};
  CHECK(what_of([&] { none.call({"PING"}); }).find("NOAUTH") != std::string::npos);
}

TEST_CASE("an actor gets a Redis reply as a message, never waiting on the "
          "socket") {
  using reply_atom = caf::atom_constant<caf::atom("reply")>;
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto client = shared_client();
  auto key = test::unique_prefix() + ":actor";
  client->call({"SET", key, "hola"});
  auto asker = sys.spawn([client, key](caf::event_based_actor* self)
                           -> caf::behavior {
    auto pending = std::make_shared<caf::response_promise>();
    return {
      [=](caf::get_atom) {
        *pending = self->make_response_promise();
        auto me = caf::actor_cast<caf::actor>(self);
        client->async({"GET", key},
                      [me](botmesh::redis_reply r, std::exception_ptr) {
                        caf::anon_send(me, reply_atom::value, r.str);
                      });
        return *pending;
      },
      [=](reply_atom, const std::string& value) { pending->deliver(value); },
    };
  });
  caf::scoped_actor self{sys};
  std::string got;
  self->request(asker, 5s, caf::get_atom::value)
    .receive([&](const std::string& v) { got = v; },
             [&](caf::error&) { got = "error"; });
  CHECK(got == "hola");
  self->send_exit(asker, caf::exit_reason::user_shutdown);
  client->call({"DEL", key});
}

namespace {

// The value of a sample line "<series> <value>" in a scrape, or -1.
double scraped(const std::string& series) {
  auto text = "\n" + botmesh::metrics::global_registry().scrape();
  auto pos = text.find("\n" + series + " ");
  if (pos == std::string::npos)
    return -1;
  auto start = pos + series.size() + 2;
  return std::stod(text.substr(start, text.find('\n', start) - start));
}

} // namespace

TEST_CASE("Redis command latency and errors are exported as botmesh_ metrics") {
  auto c = shared_client();
  auto count0 = std::max(0.0, scraped("botmesh_redis_command_seconds_count"));
  auto replies0 = std::max(0.0, scraped("botmesh_redis_errors_total{kind=\"reply\"}"));
  auto down0 = std::max(0.0, scraped("botmesh_redis_errors_total{kind=\"connection\"}"));
  c->call({"PING"});
  c->call_raw({"NOSUCHCOMMAND"});
  CHECK(scraped("botmesh_redis_command_seconds_count") >= count0 + 2);
  CHECK(scraped("botmesh_redis_errors_total{kind=\"reply\"}") >= replies0 + 1);
  // Nothing listens there: the command fails without a reply.
  botmesh::redis_client nobody{botmesh::redis_options{
    .url = "redis://127.0.0.1:" + std::to_string(test::free_port()),
    .command_timeout = "2s",
    .connect_timeout = "1s"}};
  CHECK_THROWS(nobody.call({"PING"}));
  CHECK(scraped("botmesh_redis_errors_total{kind=\"connection\"}") >= down0 + 1);
}
