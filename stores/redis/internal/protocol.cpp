// The pure parts of the Redis client (internal/protocol.hpp): URL parsing
// and the conversion and bounding of hiredis replies.

#include <botmesh/stores/redis/internal/protocol.hpp>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <botmesh/runtime/core/error.hpp>

namespace botmesh {

namespace internal {

namespace {

[[noreturn]] void bad_url(std::string_view url, std::string_view why) {
  throw invalid_argument_error(
    "url", fmt::format("invalid Redis URL \"{}\": {} (expected "
                       "redis://[user:password@]host:port[/db])",
                       url, why));
}

int parse_int(std::string_view url, std::string_view s, std::string_view what,
              int lo, int hi) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size() || v < lo
      || v > hi)
    bad_url(url, fmt::format("bad {} \"{}\"", what, s));
  return v;
}

} // namespace

endpoint_info parse_url(std::string_view url) {
  endpoint_info ep;
  constexpr std::string_view scheme = "redis://";
  if (!url.starts_with(scheme))
    bad_url(url, "it must start with redis://");
  auto rest = url.substr(scheme.size());
  if (auto at = rest.rfind('@'); at != std::string_view::npos) {
    auto cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (auto colon = cred.find(':'); colon != std::string_view::npos) {
      ep.user = std::string{cred.substr(0, colon)};
      ep.password = std::string{cred.substr(colon + 1)};
    } else {
      ep.password = std::string{cred};
    }
  }
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    auto db = rest.substr(slash + 1);
    if (!db.empty())
      ep.db = parse_int(url, db, "database", 0, 1'000'000);
    rest = rest.substr(0, slash);
  }
  if (rest.starts_with('[')) {
    // An IPv6 literal, "[::1]" or "[::1]:6379": the host is what the
    // brackets hold.
    auto close = rest.find(']');
    if (close == std::string_view::npos
        || (close + 1 < rest.size() && rest[close + 1] != ':'))
      bad_url(url, "bad IPv6 host");
    if (close + 1 < rest.size())
      ep.port = parse_int(url, rest.substr(close + 2), "port", 1, 65535);
    rest = rest.substr(1, close - 1);
  } else if (auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    ep.port = parse_int(url, rest.substr(colon + 1), "port", 1, 65535);
    rest = rest.substr(0, colon);
  }
  if (rest.empty())
    bad_url(url, "no host");
  ep.host = std::string{rest};
  return ep;
}

std::optional<std::int64_t> time_reply_ms(const redis_reply& r) {
  if (r.type != redis_reply::kind::array || r.elements.size() != 2)
    return std::nullopt;
  std::int64_t part[2] = {0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    auto& e = r.elements[i].str;
    auto [p, ec] = std::from_chars(e.data(), e.data() + e.size(), part[i]);
    if (ec != std::errc{} || p != e.data() + e.size() || part[i] < 0)
      return std::nullopt;
  }
  if (part[0] > std::numeric_limits<std::int64_t>::max() / 1000 - 1)
    return std::nullopt;
  return part[0] * 1000 + part[1] / 1000;
}

std::string node_url(std::string_view user, std::string_view password,
                     std::string_view host, int port) {
  std::string out = "redis://";
  if (!password.empty()) {
    out.append(user).append(":").append(password).append("@");
  }
  if (host.find(':') != std::string_view::npos) // IPv6: in brackets
    out.append("[").append(host).append("]");
  else
    out.append(host);
  out.append(":").append(std::to_string(port));
  return out;
}

void append_command(std::string& out, const redis_client::command& cmd) {
  std::size_t need = 16;
  for (auto& a : cmd)
    need += a.size() + 24;
  out.reserve(out.size() + need);
  char num[24];
  auto line = [&](char prefix, std::size_t n) {
    out.push_back(prefix);
    auto res = std::to_chars(num, num + sizeof num, n);
    out.append(num, res.ptr);
    out.append("\r\n", 2);
  };
  line('*', cmd.size());
  for (auto& a : cmd) {
    line('$', a.size());
    out.append(a);
    out.append("\r\n", 2);
  }
}

redis_client::command script_command(const redis_script& script,
                                     std::vector<std::string> keys,
                                     std::vector<std::string> args) {
  redis_client::command cmd;
  cmd.reserve(3 + keys.size() + args.size());
  cmd.emplace_back("EVALSHA");
  cmd.push_back(script.sha());
  cmd.push_back(std::to_string(keys.size()));
  std::move(keys.begin(), keys.end(), std::back_inserter(cmd));
  std::move(args.begin(), args.end(), std::back_inserter(cmd));
  return cmd;
}

bool to_eval(redis_client::command& cmd, const redis_script& script) {
  if (cmd.size() < 3 || cmd[0] != "EVALSHA")
    return false;
  cmd[0] = "EVAL";
  cmd[1] = script.body();
  return true;
}

redis_reply convert(const redisReply* r) {
  redis_reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = redis_reply::kind::string;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = redis_reply::kind::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = redis_reply::kind::error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = redis_reply::kind::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = redis_reply::kind::array;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i)
        out.elements.push_back(convert(r->element[i]));
      break;
    default:
      out.type = redis_reply::kind::nil;
  }
  return out;
}


// hiredis 0.14 allocates an array's element table as soon as it reads the
// header, so a hostile or broken server announcing `*1000000041` would make
// it try an 8 GB allocation. The reader's array constructor is wrapped to
// refuse counts over the bound (the reader then fails the connection).
namespace {

redisReplyObjectFunctions bounded_functions(const redisReplyObjectFunctions& d) {
  static redisReplyObjectFunctions defaults = d;
  redisReplyObjectFunctions f = d;
  f.createArray = [](const redisReadTask* task, int elements) -> void* {
    auto* g = static_cast<reader_guard*>(task->privdata);
    if (elements < 0
        || (g && static_cast<std::size_t>(elements) > g->max_elements)) {
      if (g)
        g->refused = elements;
      return nullptr;
    }
    return defaults.createArray(task, elements);
  };
  return f;
}

} // namespace

void bound_reader(redisReader* reader, reader_guard* guard) {
  static redisReplyObjectFunctions fns = bounded_functions(*reader->fn);
  reader->fn = &fns;
  reader->privdata = guard;
}

} // namespace internal

} // namespace botmesh
