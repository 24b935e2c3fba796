// The Redis client's own command encoder (internal/protocol.hpp), checked
// byte for byte against hiredis' formatter, which it replaced on the write
// path.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hiredis/hiredis.h>

#include <botmesh/stores/redis/internal/protocol.hpp>

namespace {

std::string hiredis_format(const botmesh::redis_client::command& cmd) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto& a : cmd) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* out = nullptr;
  auto n = redisFormatCommandArgv(&out, static_cast<int>(argv.size()),
                                  argv.data(), lens.data());
  REQUIRE(n > 0);
  std::string s{out, static_cast<std::size_t>(n)};
  redisFreeCommand(out);
  return s;
}

} // namespace

TEST_CASE("the Redis command encoder writes what hiredis writes, and "
          "appends commands back to back") {
  std::vector<botmesh::redis_client::command> cmds{
    {"PING"},
    {"SET", "k", ""},
    {"EVALSHA", std::string(40, 'a'), "2", "{t:1}:h", "{t:1}:q", "arg"},
    {"HSET", "k", "f", std::string("bin\0\r\nary", 9)},
    {"SET", "big", std::string(100'000, 'x')},
    {"X", "1234567890", "é"},
  };
  std::string all, expected;
  for (auto& c : cmds) {
    std::string one;
    botmesh::internal::append_command(one, c);
    CHECK(one == hiredis_format(c));
    botmesh::internal::append_command(all, c);
    expected += hiredis_format(c);
  }
  CHECK(all == expected);
  std::string exact;
  botmesh::internal::append_command(exact, {"GET", "key"});
  CHECK(exact == "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
}

TEST_CASE("a cluster node's URL keeps a password holding ':' or '@' whole, "
          "with or without a user") {
  using botmesh::internal::node_url;
  using botmesh::internal::parse_url;
  auto a = parse_url(node_url("", "p:q", "10.0.0.1", 7000));
  CHECK(a.user.empty());
  CHECK(a.password == "p:q");
  CHECK(a.host == "10.0.0.1");
  CHECK(a.port == 7000);
  auto b = parse_url(node_url("bot", "x@y:z", "h", 7001));
  CHECK(b.user == "bot");
  CHECK(b.password == "x@y:z");
  CHECK(b.host == "h");
  auto c = parse_url(node_url("", "", "h", 7002));
  CHECK(c.user.empty());
  CHECK(c.password.empty());
  CHECK(c.port == 7002);
}

TEST_CASE("a Redis URL with an IPv6 host in brackets gives the bare host, "
          "and a cluster node's IPv6 address round-trips") {
  using botmesh::internal::node_url;
  using botmesh::internal::parse_url;
  auto a = parse_url("redis://:pw@[::1]:6380/2");
  CHECK(a.host == "::1");
  CHECK(a.port == 6380);
  CHECK(a.password == "pw");
  CHECK(a.db == 2);
  auto b = parse_url("redis://[fe80::1]");
  CHECK(b.host == "fe80::1");
  CHECK(b.port == 6379);
  auto n = parse_url(node_url("", "", "2001:db8::7", 7000));
  CHECK(n.host == "2001:db8::7");
  CHECK(n.port == 7000);
  CHECK_THROWS_AS(parse_url("redis://[::1:6379"), botmesh::invalid_argument_error);
  CHECK_THROWS_AS(parse_url("redis://[::1]x"), botmesh::invalid_argument_error);
  CHECK_THROWS_AS(parse_url("redis://[]:6379"), botmesh::invalid_argument_error);
}

TEST_CASE("a TIME reply reads as Unix milliseconds, and any other reply as "
          "nothing") {
  using botmesh::redis_reply;
  using kind = redis_reply::kind;
  auto str = [](std::string s) {
    redis_reply r;
    r.type = kind::string;
    r.str = std::move(s);
    return r;
  };
  auto time = [&](std::string secs, std::string micros) {
    redis_reply r;
    r.type = kind::array;
    r.elements = {str(std::move(secs)), str(std::move(micros))};
    return r;
  };
  CHECK(botmesh::internal::time_reply_ms(time("1700000000", "123456"))
        == 1700000000123);
  // The largest seconds whose milliseconds (and the micros' share) fit.
  CHECK(botmesh::internal::time_reply_ms(time("9223372036854774", "999999"))
        == 9223372036854774999);
  for (auto bad : {time("9223372036854775", "0"), time("x", "0"),
                   time("1", "-5"), time("1", "2.5"), time("", "0")}) {
    CAPTURE(bad.elements[0].str);
    CAPTURE(bad.elements[1].str);
    CHECK_FALSE(botmesh::internal::time_reply_ms(bad));
  }
  redis_reply error;
  error.type = kind::error;
  error.str = "ERR unknown command";
  CHECK_FALSE(botmesh::internal::time_reply_ms(error));
  auto one = time("1", "0");
  one.elements.pop_back();
  CHECK_FALSE(botmesh::internal::time_reply_ms(one));
}
