#include <botmesh/stores/redis/redis_durable_backend.hpp>

#include <charconv>

#include <fmt/format.h>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/internal/scripts.hpp>

namespace botmesh {

namespace {

// The chat part of a journal id (`<key>#<platform id>`): operations on one
// chat share a connection, so they run in the order they were issued.
std::string_view affinity_of(std::string_view id) {
  auto pos = id.rfind('#');
  return pos == std::string_view::npos ? id : id.substr(0, pos);
}

std::exception_ptr reply_error(std::string_view what, const redis_reply& r) {
  if (r.type == redis_reply::kind::error) {
    if (r.str.find("corrupted durable record") != std::string::npos)
      return std::make_exception_ptr(
        error(errc::corrupted_record, fmt::format("{}: {}", what, r.str)));
    return std::make_exception_ptr(
      error(errc::store_error, fmt::format("{}: Redis error: {}", what, r.str)));
  }
  return nullptr;
}

std::exception_ptr bad_reply(std::string_view what, const redis_reply& r) {
  return std::make_exception_ptr(error(
    errc::corrupted_record,
    fmt::format("{}: unexpected Redis reply of type {}", what, to_string(r.type))));
}

std::uint64_t to_u64(std::string_view what, std::string_view s) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size())
    throw error(errc::corrupted_record,
                fmt::format("{}: \"{}\" is not a count", what, s));
  return v;
}

// Flat id, key, message, seq, attempts lists of durable_claim.lua.
std::vector<journal_record> records_of(const redis_reply& r) {
  if (r.type != redis_reply::kind::array || r.elements.size() % 5 != 0)
    throw error(errc::corrupted_record,
                "durable_claim: a record list is not a multiple of 5 strings");
  std::vector<journal_record> out;
  for (std::size_t i = 0; i < r.elements.size(); i += 5) {
    for (std::size_t j = 0; j < 5; ++j)
      if (r.elements[i + j].type != redis_reply::kind::string)
        throw error(errc::corrupted_record,
                    "durable_claim: a record field is not a string");
    journal_record rec;
    rec.id = r.elements[i].str;
    rec.key = r.elements[i + 1].str;
    rec.message = r.elements[i + 2].str;
    auto what = fmt::format("durable record {}", rec.id);
    rec.seq = to_u64(what, r.elements[i + 3].str);
    rec.attempts = static_cast<std::uint32_t>(to_u64(what, r.elements[i + 4].str));
    out.push_back(std::move(rec));
  }
  return out;
}

} // namespace

struct redis_durable_backend::impl {
  std::shared_ptr<redis_client> client;
  std::string inbound; // p:{durable:inbound}:
  std::string outbox;  // p:{durable:outbox}:

  std::vector<std::string> in_keys(std::initializer_list<const char*> parts) const {
    std::vector<std::string> out;
    for (auto p : parts)
      out.push_back(inbound + p);
    return out;
  }
};

redis_durable_backend::redis_durable_backend(redis_durable_options opts)
  : impl_(std::make_unique<impl>()) {
  if (!opts.client)
    throw invalid_argument_error("client",
                                 "redis_durable_options.client is required");
  if (opts.prefix.empty())
    throw invalid_argument_error("prefix", "the Redis key prefix must not be "
                                           "empty");
  impl_->client = std::move(opts.client);
  impl_->inbound = opts.prefix + ":{durable:inbound}:";
  impl_->outbox = opts.prefix + ":{durable:outbox}:";
}

redis_durable_backend::~redis_durable_backend() {
  // nop
}

void redis_durable_backend::start() {
  auto& l = internal::lua();
  for (auto* s : {&l.durable_record, &l.durable_settle, &l.durable_claim,
                  &l.durable_outbox})
    impl_->client->preload(*s);
}

void redis_durable_backend::record(journal_record rec, std::string_view holder,
                                   std::chrono::milliseconds ttl,
                                   completion<journal_put> done) {
  auto aff = rec.key; // one chat's records are written in order
  impl_->client->eval_async(
    aff, internal::lua().durable_record,
    impl_->in_keys({"rec", "open", "exp", "seq"}),
    {rec.id, rec.key, rec.message, std::string{holder},
     std::to_string(ttl.count())},
    [done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (!e)
        e = reply_error("durable_record", r);
      if (!e && r.type != redis_reply::kind::integer)
        e = bad_reply("durable_record", r);
      if (e)
        return done(journal_put::duplicate, e);
      done(r.integer == 0 ? journal_put::duplicate : journal_put::recorded,
           nullptr);
    });
}

namespace {

void settle(redis_client& c, const std::vector<std::string>& keys,
            std::string_view id, std::string_view holder, const char* mode,
            durable_backend::completion<bool> done) {
  c.eval_async(affinity_of(id), internal::lua().durable_settle, keys,
               {std::string{id}, std::string{holder}, mode},
               [done = std::move(done)](redis_reply r, std::exception_ptr e) {
                 if (!e)
                   e = reply_error("durable_settle", r);
                 if (!e && r.type != redis_reply::kind::integer)
                   e = bad_reply("durable_settle", r);
                 done(!e && r.integer == 1, e);
               });
}

} // namespace

void redis_durable_backend::confirm(std::string_view id,
                                    std::string_view holder,
                                    completion<bool> done) {
  settle(*impl_->client, impl_->in_keys({"rec", "open"}), id, holder, "done",
         std::move(done));
}

void redis_durable_backend::release(std::string_view id,
                                    std::string_view holder,
                                    completion<bool> done) {
  settle(*impl_->client, impl_->in_keys({"rec", "open"}), id, holder, "free",
         std::move(done));
}

void redis_durable_backend::beat_and_claim(std::string_view holder,
                                           std::chrono::milliseconds lease,
                                           std::size_t limit,
                                           std::uint32_t max_attempts,
                                           completion<claim_result> done) {
  impl_->client->eval_async(
    holder, internal::lua().durable_claim,
    impl_->in_keys({"rec", "open", "exp", "hb"}),
    {std::string{holder}, std::to_string(lease.count()), std::to_string(limit),
     std::to_string(max_attempts)},
    [done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (!e)
        e = reply_error("durable_claim", r);
      claim_result out;
      if (!e) {
        try {
          if (r.type != redis_reply::kind::array || r.elements.size() != 3)
            throw error(errc::corrupted_record,
                        "durable_claim: the reply is not 3 lists");
          out.records = records_of(r.elements[0]);
          out.dropped = records_of(r.elements[1]);
          for (auto& id : r.elements[2].elements)
            out.corrupted.push_back(id.str);
        } catch (...) {
          e = std::current_exception();
        }
      }
      done(std::move(out), e);
    });
}

void redis_durable_backend::retire(std::string_view holder,
                                   completion<bool> done) {
  impl_->client->async(
    holder, {"ZREM", impl_->inbound + "hb", std::string{holder}},
    [done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (!e)
        e = reply_error("durable retire (ZREM)", r);
      done(!e && r.integer == 1, e);
    });
}

void redis_durable_backend::outbox_claim(std::string_view send_id,
                                         std::string_view key,
                                         std::uint64_t fence,
                                         std::chrono::milliseconds ttl,
                                         completion<outbox_verdict> done) {
  auto& o = impl_->outbox;
  impl_->client->eval_async(
    key, internal::lua().durable_outbox, {o + "sent", o + "fence", o + "fexp"},
    {std::string{send_id}, std::string{key}, std::to_string(fence),
     std::to_string(ttl.count())},
    [done = std::move(done)](redis_reply r, std::exception_ptr e) {
      if (!e)
        e = reply_error("durable_outbox", r);
      if (!e && r.type != redis_reply::kind::integer)
        e = bad_reply("durable_outbox", r);
      if (e)
        return done(outbox_verdict::fenced, e);
      done(r.integer > 0    ? outbox_verdict::send
           : r.integer == 0 ? outbox_verdict::duplicate
                            : outbox_verdict::fenced,
           nullptr);
    });
}

} // namespace botmesh
