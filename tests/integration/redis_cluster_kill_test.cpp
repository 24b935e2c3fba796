// Chaos on the Redis Cluster (issue 14): two bots (replicas of one bot,
// each with its own cluster client, store and coordinator) take turns on
// chats whose turn keys live on one master, running a persistent order
// flow whose messages alternate between them (each answer resumes from the
// checkpoint the other wrote), while pings sent to both at once make them
// compete for the same turns. That master is SIGKILLed, its replica takes
// over, the load goes on, and the killed node is started again with its
// command line: it rejoins as a replica and the cluster is whole again.
//
// What is asserted:
// - Exclusion: two turns of one chat never run at once both to completion.
//   The spec's caveat (replication is asynchronous: a failover may lose the
//   last acknowledged writes, so a lease may be granted twice) cannot give
//   two effective holders here: a turn is valid for `lease` (2 s) from the
//   renewal request that left last, the replica takes over only after
//   cluster-node-timeout (2 s) plus its election, so a holder cut off by
//   the kill is fenced before anyone can be granted the turn on the new
//   master. Two handlers of one chat may overlap only when one of them was
//   fenced: its turn ends failed, with an error event.
// - Every message gets an outcome; each one not handled (failed, refused)
//   has an events::error with a code naming it: in = handled + failed +
//   refused, nothing silently dropped.
// - An order none of whose messages got an error event ends with exactly
//   the right answers (each question once, the summary "Q x P a D" once).
//   One with an error event ends with the summary or counts as ended by a
//   documented error: a message that failed (sent again by the user, as a
//   person would), or a step whose checkpoint write was refused as
//   "superseded" (lease_lost) because the failover lost the revision the
//   previous step had written: the spec's "una actualización
//   compare-and-set perdida".
// - The same caveat without an error: an order under way when the master
//   died whose checkpoint the failover set back (or lost) asks a question
//   again, or takes its last answer as a new message, and gives no
//   summary. Counted and printed, not failed; any other shape fails.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

constexpr std::chrono::milliseconds lease{2000};
constexpr int lanes = 4;

using test::eventually;

// True when every node that answers says `id` is a master serving `slot`.
bool all_agree(int slot, const std::string& id) {
  try {
    for (auto& n : test::cluster_nodes())
      if (!n.failed) {
        std::vector<test::cluster_node> view;
        try {
          view = test::cluster_nodes(n.address);
        } catch (const std::exception&) {
          continue; // the killed node
        }
        bool ok = false;
        for (auto& m : view)
          ok = ok || (m.id == id && m.master && m.serves(slot));
        if (!ok)
          return false;
      }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// What both bots did, by message id.
struct journal {
  std::mutex mtx;
  std::condition_variable cv;
  std::map<std::string, botmesh::turn_outcome> outcomes;
  std::map<std::string, std::vector<std::pair<botmesh::errc, std::string>>> errors;
  std::vector<std::pair<botmesh::errc, std::string>> other_errors;
  std::vector<std::string> lost; // lease_lost events
  // Handlers running now, per chat key; pairs of message ids of one chat
  // that ran at once.
  std::map<std::string, std::vector<std::string>> inside;
  std::vector<std::pair<std::string, std::string>> overlaps;
  long long injected = 0;
};

struct replica {
  std::string name;
  std::shared_ptr<botmesh::testing_provider> provider =
    std::make_shared<botmesh::testing_provider>();
  std::shared_ptr<botmesh::redis_store> store;
  std::unique_ptr<botmesh::bot> bot;

  replica(std::string id, const std::string& prefix, journal& j) : name(id) {
    store = std::make_shared<botmesh::redis_store>(botmesh::redis_store_options{
      .prefix = prefix, .cluster = test::cluster_options()});
    botmesh::coordination_options co;
    co.coordinator = store->coordinator(id, lease);
    // Far above the outage: a message waits for its turn through it.
    co.turn_wait = "45s";
    bot = std::make_unique<botmesh::bot>(botmesh::bot_options{
      .provider = provider, .store = store, .coordination = co});
    // Around everything a message reaches: who is inside a chat's turn.
    bot->use([&j](botmesh::context& c, const std::function<void()>& next) {
      auto id = c.message().id;
      {
        std::lock_guard g{j.mtx};
        auto& in = j.inside[c.key()];
        for (auto& other : in)
          j.overlaps.emplace_back(other, id);
        in.push_back(id);
      }
      struct leave {
        journal& j;
        std::string key, id;
        ~leave() {
          std::lock_guard g{j.mtx};
          auto& in = j.inside[key];
          std::erase(in, id);
        }
      } on_exit{j, c.key(), id};
      if (c.text() == "ping") {
        std::this_thread::sleep_for(20ms); // hold the turn a little
        c.reply("pong " + id);
        return;
      }
      next();
    });
    botmesh::flow f{"pedido"};
    f.hears({"pedido"})
      .ask("producto", "¿Producto?",
           [](botmesh::flow_context& c, const botmesh::answer& a) {
             c.state()["producto"] = a.text();
           })
      .ask("cantidad", "¿Cantidad?",
           [](botmesh::flow_context& c, const botmesh::answer& a) {
             c.state()["cantidad"] = a.text();
           })
      .ask("direccion", "¿Dirección?",
           [](botmesh::flow_context& c, const botmesh::answer& a) {
             c.send(c.state()["cantidad"].get<std::string>() + " x "
                    + c.state()["producto"].get<std::string>() + " a "
                    + a.text());
           });
    f.persistent();
    bot->add_flow(std::move(f));
    bot->on_message([](botmesh::context& c) { c.reply("nuevo: " + c.text()); });
    bot->on<botmesh::events::error>([&j](const botmesh::events::error& e) {
      std::lock_guard g{j.mtx};
      if (e.message)
        j.errors[e.message->id].emplace_back(e.code, e.what);
      else
        j.other_errors.emplace_back(e.code, e.what);
    });
    bot->on<botmesh::events::lease_lost>(
      [&j, id](const botmesh::events::lease_lost& e) {
        std::lock_guard g{j.mtx};
        j.lost.push_back(id + " " + e.key + " " + e.reason);
      });
  }

  ~replica() {
    bot.reset();
  }
};

// Delivers `text` to `r` as message `id` of `chat` and waits for its
// outcome; nothing when none came within 60 s (a message lost).
std::optional<botmesh::turn_outcome> say(journal& j, replica& r,
                                         const std::string& chat,
                                         const std::string& text,
                                         const std::string& id) {
  botmesh::inbound_message m;
  m.chat = m.sender = chat;
  m.id = id;
  m.text = text;
  {
    std::lock_guard g{j.mtx};
    ++j.injected;
  }
  r.provider->inject(std::move(m),
                     botmesh::delivery_callbacks{
                       [&j, id](botmesh::errc e) {
                         if (e != botmesh::errc::none) {
                           std::lock_guard g{j.mtx};
                           j.outcomes[id] = botmesh::turn_outcome::refused;
                           j.errors[id].emplace_back(e, "not accepted");
                           j.cv.notify_all();
                         }
                       },
                       [&j, id](botmesh::turn_outcome o) {
                         std::lock_guard g{j.mtx};
                         j.outcomes[id] = o;
                         j.cv.notify_all();
                       }});
  std::unique_lock lk{j.mtx};
  if (!j.cv.wait_for(lk, 60s, [&] { return j.outcomes.contains(id); }))
    return std::nullopt;
  return j.outcomes[id];
}

} // namespace

TEST_CASE("cluster chaos: two bots taking turns keep each chat's turns "
          "exclusive, answer their orders and drop nothing while the master "
          "of the chats' turns is killed, replaced and started again") {
  auto prefix = test::unique_prefix("bmkill");
  botmesh::redis_cluster_layout L{prefix};
  // The victim: a master other than the seed (the helpers read the
  // topology through the seed), with a replica in sync.
  auto seed = test::seed_address();
  test::cluster_node victim;
  for (auto& n : test::cluster_nodes())
    if (n.master && !n.failed && !n.slots.empty() && n.address != seed)
      victim = n;
  REQUIRE_FALSE(victim.id.empty());
  auto heir = test::synced_replica_of(victim);
  const int probe_slot = victim.slots.front().first;
  MESSAGE("killing ", victim.address, "; its replica ", heir.address,
          " takes over");

  // Chat ids whose turn keys live on the victim: a fresh one per order.
  std::atomic<int> next_chat{0};
  auto fresh_chat = [&] {
    for (;;) {
      auto c = "o" + std::to_string(next_chat++);
      if (victim.serves(botmesh::redis_client::key_slot(L.turn("test:" + c, "h"))))
        return c;
    }
  };

  journal j;
  replica a{"a", prefix, j}, b{"b", prefix, j};
  a.bot->start();
  b.bot->start();
  replica* both[2] = {&a, &b};

  std::atomic<bool> stop{false};
  std::atomic<int> rounds[lanes];
  std::vector<std::string> violations;
  std::mutex vmtx;
  auto violation = [&](std::string v) {
    std::lock_guard g{vmtx};
    violations.push_back(std::move(v));
  };
  struct order {
    std::string chat, p, q, d;
    std::vector<std::string> ids; // its messages, every attempt
    bool failed = false;          // a message of it was not handled
    steady::time_point began, ended;
  };
  std::vector<order> orders;
  // The kill happened between these two instants.
  steady::time_point killed_at = steady::time_point::max(), killed_by;
  std::mutex omtx;
  long long pings = 0;

  auto lane = [&](int n) {
    rounds[n] = 0;
    std::atomic<bool> round_done{false};
    std::string chat;
    std::mutex chat_mtx;
    // Pings: to both bots at once, again and again, on the lane's chat.
    std::thread pinger{[&] {
      for (int k = 0; !round_done; ++k) {
        std::string c;
        {
          std::lock_guard g{chat_mtx};
          c = chat;
        }
        if (c.empty()) {
          std::this_thread::sleep_for(2ms);
          continue;
        }
        std::optional<botmesh::turn_outcome> outs[2];
        std::string ids[2];
        std::thread other{[&] {
          ids[1] = "ping-" + c + "-" + std::to_string(k) + "-b";
          outs[1] = say(j, b, c, "ping", ids[1]);
        }};
        ids[0] = "ping-" + c + "-" + std::to_string(k) + "-a";
        outs[0] = say(j, a, c, "ping", ids[0]);
        other.join();
        for (int i = 0; i < 2; ++i)
          if (!outs[i])
            violation("no outcome within 60 s for " + ids[i]);
        {
          std::lock_guard g{omtx};
          pings += 2;
        }
        std::this_thread::sleep_for(5ms);
      }
    }};
    for (int r = 0; !stop; ++r) {
      order o;
      o.began = steady::now();
      o.chat = fresh_chat();
      auto tag = std::to_string(n) + "." + std::to_string(r);
      o.p = "P" + tag;
      o.q = "Q" + tag;
      o.d = "D" + tag;
      {
        std::lock_guard g{chat_mtx};
        chat = o.chat;
      }
      std::string texts[4] = {"pedido", o.p, o.q, o.d};
      for (int i = 0; i < 4; ++i) {
        for (int attempt = 0;; ++attempt) {
          auto& rep = *both[(i + attempt + n) % 2]; // alternate the bots
          auto id = o.chat + "-" + std::to_string(i) + "-" + std::to_string(attempt);
          o.ids.push_back(id);
          auto out = say(j, rep, o.chat, texts[i], id);
          if (!out) {
            violation("no outcome within 60 s for " + id);
            break;
          }
          if (*out == botmesh::turn_outcome::handled)
            break;
          o.failed = true;
          if (attempt == 30) {
            violation("message " + texts[i] + " of " + o.chat
                      + " failed 30 times");
            break;
          }
        }
      }
      o.ended = steady::now();
      {
        std::lock_guard g{omtx};
        orders.push_back(o);
      }
      ++rounds[n];
    }
    round_done = true;
    pinger.join();
  };

  test::load_threads threads{stop};
  for (int n = 0; n < lanes; ++n)
    threads.run(lane, n);
  auto more_rounds = [&](int k) {
    int at[lanes];
    for (int n = 0; n < lanes; ++n)
      at[n] = rounds[n];
    return eventually([&] {
      for (int n = 0; n < lanes; ++n)
        if (rounds[n] < at[n] + k)
          return false;
      return true;
    });
  };

  REQUIRE(more_rounds(2));
  killed_at = steady::now();
  auto pid = test::kill_node(victim.address);
  killed_by = steady::now();
  // The replica takes over once the other masters agree (node timeout 2 s).
  bool promoted = eventually([&] { return all_agree(probe_slot, heir.id); });
  auto outage = std::chrono::duration_cast<std::chrono::milliseconds>(
    steady::now() - killed_at);
  MESSAGE("killed pid ", pid, "; ", heir.address, " serves its slots after ",
          outage.count(), " ms");
  bool went_on = promoted && more_rounds(2);
  test::restart_node(victim.address);
  bool whole = eventually([&] {
    if (!test::cluster_is_whole())
      return false;
    for (auto& n : test::cluster_nodes(victim.address))
      if (n.id == victim.id)
        return !n.master && n.master_id == heir.id;
    return false;
  });
  bool after = whole && more_rounds(1);
  threads.stop_all();
  a.bot->stop();
  b.bot->stop();

  REQUIRE(promoted);
  CHECK(went_on);
  REQUIRE(whole); // later tests need the 6 nodes
  CHECK(after);
  for (auto& v : violations)
    FAIL_CHECK(v);

  std::lock_guard g{j.mtx};
  // Nothing dropped: every message has an outcome, and every one not
  // handled an error event with a code.
  long long handled = 0, failed = 0, refused = 0, other = 0;
  std::map<std::string, int> codes;
  for (auto& [id, es] : j.errors)
    for (auto& [code, what] : es) {
      const auto& what_ = what; // (clang 14: no binding in a lambda)
      CAPTURE(what_);
      CHECK(code != botmesh::errc::none);
      ++codes[std::string{botmesh::to_string(code)}];
    }
  for (auto& [id, o] : j.outcomes) {
    if (o == botmesh::turn_outcome::handled) {
      ++handled;
      continue;
    }
    (o == botmesh::turn_outcome::failed    ? failed
     : o == botmesh::turn_outcome::refused ? refused
                                           : other)++;
    const auto& id_ = id; // (clang 14: no binding in a lambda)
    CAPTURE(id_);
    auto e = j.errors.find(id);
    REQUIRE(e != j.errors.end());
    for (auto& [code, what] : e->second)
      CHECK_FALSE(what.empty());
  }
  CHECK(other == 0);
  CHECK(static_cast<long long>(j.outcomes.size()) == j.injected);
  CHECK(handled + failed + refused == j.injected);
  for (auto& [code, what] : j.other_errors) {
    const auto& what_ = what; // (clang 14: no binding in a lambda)
    CAPTURE(what_);
    CHECK(code != botmesh::errc::none);
    ++codes["(no message) " + std::string{botmesh::to_string(code)}];
  }
  std::set<std::string> texts; // a few, for the log
  for (auto& [id, es] : j.errors)
    for (auto& [code, what] : es)
      if (texts.size() < 5)
        texts.insert(std::string{botmesh::to_string(code)} + ": " + what);
  for (auto& t : texts)
    MESSAGE("error event: ", t);
  std::string said_after_error; // one order ended by an error, for the log
  std::string summary;
  for (auto& [c, n] : codes)
    summary += " " + c + "=" + std::to_string(n);
  MESSAGE(j.injected, " messages: ", handled, " handled, ", failed,
          " failed, ", refused, " refused; errors:", summary, "; ",
          j.lost.size(), " lease(s) lost; ", pings, " pings");

  // Exclusion: of two handlers of one chat that ran at once, at most one
  // turn completed.
  for (auto& [x, y] : j.overlaps) {
    const auto& x_ = x; // (clang 14: no binding in a lambda)
    CAPTURE(x_);
    const auto& y_ = y; // (clang 14: no binding in a lambda)
    CAPTURE(y_);
    auto ox = j.outcomes[x], oy = j.outcomes[y];
    CHECK((ox != botmesh::turn_outcome::handled
           || oy != botmesh::turn_outcome::handled));
  }
  MESSAGE(j.overlaps.size(), " overlap(s) of a fenced turn with the next");

  // Pongs: each handled ping answered by the bot that had it.
  for (auto* r : both) {
    std::set<std::string> sent;
    for (auto& m : r->provider->sent())
      sent.insert(m.text);
    for (auto& [id, o] : j.outcomes)
      if (id.starts_with("ping-") && o == botmesh::turn_outcome::handled
          && id.ends_with(r == &a ? "-a" : "-b")) {
        const auto& id_ = id; // (clang 14: no binding in a lambda)
        CAPTURE(id_);
        CHECK(sent.contains("pong " + id));
      }
  }

  // Orders.
  int right = 0, ended_by_error = 0, restarted_by_lost_write = 0;
  // What each bot told an order's chat, in order, and what became of each
  // of its messages: for an order that did not end as it should.
  auto describe = [&](const order& o) {
    std::string out;
    for (auto* r : both) {
      out += " " + r->name + ":";
      for (auto& m : r->provider->sent_to(o.chat))
        out += " [" + m.text + "]";
    }
    for (auto& id : o.ids) {
      out += " " + id + "=";
      if (auto i = j.outcomes.find(id); i != j.outcomes.end())
        out += std::string{to_string(i->second)};
      if (auto e = j.errors.find(id); e != j.errors.end())
        for (auto& [code, what] : e->second)
          out += " (" + what + ")";
    }
    return out;
  };
  for (auto& o : orders) {
    std::multiset<std::string> said;
    for (auto* r : both)
      for (auto& m : r->provider->sent_to(o.chat))
        if (!m.text.starts_with("pong "))
          said.insert(m.text);
    auto summary_text = o.q + " x " + o.p + " a " + o.d;
    CAPTURE(o.chat);
    CAPTURE(summary_text);
    // An error event about a handled message: a step cut by a refused
    // checkpoint write ("superseded": the failover lost the revision the
    // step had written, the spec's caveat), which ends the conversation.
    for (auto& id : o.ids) {
      o.failed = o.failed || j.errors.contains(id);
      if (!j.errors.contains(id))
        continue;
      // Only writes made before the kill can be lost: an order refused as
      // superseded was under way when the master died (its turn state,
      // which names the chat's last holder, lives there; its checkpoint
      // may too).
      for (auto& [code, what] : j.errors[id])
        if (what.find("superseded") != std::string::npos) {
          const auto& what_ = what; // (clang 14: no binding in a lambda)
          CAPTURE(what_);
          CHECK(o.began < killed_by);
          CHECK(o.ended > killed_at);
        }
    }
    if (!o.failed) {
      std::string said_text; // doctest prints no multiset
      for (auto& t : said)
        said_text += "[" + t + "]";
      CAPTURE(said_text);
      bool exact = said
                   == std::multiset<std::string>{"¿Producto?", "¿Cantidad?",
                                                 "¿Dirección?", summary_text};
      // The spec's caveat (asynchronous replication): a failover can lose
      // the last acknowledged writes. A checkpoint the failover set back
      // (to an earlier step, or to before it waited) or lost shows, with no
      // error, as a question asked again, or the last answer taken as a new
      // message ("nuevo: ..."), and no summary. Only an order under way
      // when the master died can show it.
      bool set_back_shape =
        said.size() == 4 && !said.contains(summary_text)
        && std::all_of(said.begin(), said.end(), [&](auto& t) {
             return t == "¿Producto?" || t == "¿Cantidad?"
                    || t == "¿Dirección?" || t == "nuevo: " + o.d;
           });
      bool restarted = !exact && o.began < killed_by && o.ended > killed_at
                       && set_back_shape;
      if (restarted) {
        ++restarted_by_lost_write;
        MESSAGE(o.chat, " went back (its checkpoint set back by the "
                "failover):", describe(o));
      } else {
        auto story = describe(o);
        CAPTURE(story);
        CHECK(exact);
        ++right;
      }
    } else if (said.contains(summary_text)) {
      ++right;
    } else {
      ++ended_by_error;
      if (said_after_error.empty())
        said_after_error = describe(o);
    }
  }
  MESSAGE(orders.size(), " orders: ", right, " with the right answers, ",
          ended_by_error, " ended by a documented error", said_after_error,
          "; ", restarted_by_lost_write,
          " went back after a checkpoint set back by the failover");
  CHECK(right > 0);
}
