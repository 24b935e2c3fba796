// Conversations on the cluster:v1 store while the cluster fails over: each
// chat appends its messages and advances its checkpoint by compare-and-set,
// and after a manual failover of the master serving their logs nothing is
// lost, duplicated or reordered. A write that failed (with an error naming
// it) is checked and retried the way a conversation would.

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include <botmesh/runtime/core/error.hpp>
#include <botmesh/stores/redis/redis_cluster_layout.hpp>
#include <botmesh/stores/redis/redis_store.hpp>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;

namespace {

// One chat's conversation: message i, then its checkpoint at step i.
class conversation {
 public:
  conversation(botmesh::store& s, std::string chat)
    : s_(s), chat_(std::move(chat)), thread_([this] { run(); }) {
    // nop
  }

  ~conversation() {
    finish();
  }

  void finish() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
  }

  void mark() {
    marked_ = true;
  }

  /// Yields until `n` steps completed after the mark (or at all).
  void await_steps(int n) const {
    while ((marked_ ? after_mark_ : steps_).load() < n)
      std::this_thread::yield();
  }

  const std::string& chat() const {
    return chat_;
  }
  int steps() const {
    return steps_;
  }
  /// Read after finish().
  std::vector<std::string> errors;
  int refused = 0; // compare-and-set refusals: a write lost behind our back

 private:
  template <class F>
  void retry(F&& attempt, const std::function<bool()>& happened) {
    for (;;) {
      try {
        attempt();
        return;
      } catch (const botmesh::error& e) {
        errors.emplace_back(e.what());
        // A lost reply may have run: look before trying again.
        for (;;) {
          try {
            if (happened())
              return;
            break;
          } catch (const botmesh::error& e2) {
            errors.emplace_back(e2.what());
          }
        }
      }
    }
  }

  void run() {
    botmesh::flow_checkpoint cp;
    cp.key = chat_;
    cp.flow = "pedido";
    std::uint64_t rev = 0;
    for (int i = 1; !stop_; ++i) {
      auto text = std::to_string(i);
      retry([&] { s_.append_message(chat_, {0, botmesh::direction::in,
                                            "m" + text, "u", text}); },
            [&] {
              auto last = s_.messages(chat_, 1);
              return !last.empty() && last.back().text == text;
            });
      cp.state = R"({"n":)" + text + "}";
      retry(
        [&] {
          auto r = s_.set_checkpoint_if(cp, rev);
          if (!r) {
            ++refused;
            auto now = s_.get_checkpoint(chat_);
            rev = now ? now->revision : 0;
            throw botmesh::error(botmesh::errc::store_error, "refused");
          }
          rev = *r;
        },
        [&] {
          auto now = s_.get_checkpoint(chat_);
          if (now && now->state == cp.state) {
            rev = now->revision;
            return true;
          }
          return false;
        });
      ++steps_;
      if (marked_)
        ++after_mark_;
    }
  }

  botmesh::store& s_;
  std::string chat_;
  std::atomic<bool> stop_{false}, marked_{false};
  std::atomic<int> steps_{0}, after_mark_{0};
  std::thread thread_;
};

// Runs `f` until no node answers LOADING (a replica resyncing after a
// failover) or another transient error.
template <class F>
auto settled(F f) {
  for (;;) {
    try {
      return f();
    } catch (const botmesh::error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

// True when every node that is up says `id` serves `slot`.
bool all_agree(int slot, const std::string& id) {
  return settled([&] {
    for (auto& n : test::cluster_nodes())
      if (!n.failed) {
        bool ok = false;
        for (auto& m : test::cluster_nodes(n.address))
          ok = ok || (m.id == id && m.master && m.serves(slot));
        if (!ok)
          return false;
      }
    return true;
  });
}

// Makes `replica` the master of `slot` with CLUSTER FAILOVER and returns
// once every node agrees. Back-to-back failovers of one shard can be
// undone by an epoch collision: then it is asked again (Redis gives a
// manual failover 5 s; after 6 s without agreement, ask again).
void fail_over(const test::cluster_node& replica, int slot) {
  auto c = test::node_client(replica.address);
  for (;;) {
    while (settled([&] { return c->call({"INFO", "replication"}).str; })
             .find("master_link_status:up")
           == std::string::npos) {
      if (all_agree(slot, replica.id))
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    c->call_raw({"CLUSTER", "FAILOVER"});
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
    while (std::chrono::steady_clock::now() < until) {
      if (all_agree(slot, replica.id))
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

} // namespace

TEST_CASE("cluster topology: conversations on the cluster store lose, repeat "
          "and reorder nothing across a manual failover of their master") {
  auto prefix = test::unique_prefix("bmchaos");
  botmesh::redis_store store{{.prefix = prefix,
                              .max_log_per_chat = 100'000'000,
                              .cluster = test::cluster_options()}};
  store.start();
  botmesh::redis_cluster_layout L{prefix};
  // Four chats whose logs live on one master: the one that fails over.
  auto first = "tg:" + test::unique_prefix("c");
  int slot = botmesh::redis_client::key_slot(L.message_log(first));
  // Start from a settled topology: every node agrees on the slot's master.
  auto master = settled([&] { return test::master_of(slot); });
  while (!all_agree(slot, master.id)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    master = settled([&] { return test::master_of(slot); });
  }
  std::vector<std::string> chats{first};
  for (int i = 0; chats.size() < 4; ++i) {
    auto c = first + "-" + std::to_string(i);
    if (master.serves(botmesh::redis_client::key_slot(L.message_log(c))))
      chats.push_back(c);
  }
  auto replica = settled([&] { return test::synced_replica_of(master); });
  std::vector<std::unique_ptr<conversation>> convs;
  for (auto& c : chats)
    convs.push_back(std::make_unique<conversation>(store, c));
  for (auto& c : convs)
    c->await_steps(30);
  fail_over(replica, slot);
  for (auto& c : convs)
    c->mark();
  for (auto& c : convs)
    c->await_steps(30);
  for (auto& c : convs)
    c->finish();
  CHECK(settled([&] { return test::master_of(slot); }).id == replica.id);
  std::size_t failures = 0;
  for (auto& c : convs)
    failures += c->errors.size();
  MESSAGE(failures, " failed call(s) retried across the failover");
  for (auto& c : convs) {
    CAPTURE(c->chat());
    for (auto& e : c->errors) {
      CAPTURE(e);
      // Every failure names the script or the command that failed (a
      // reply lost while the old master paused its clients: "EVALSHA: no
      // reply within 5s").
      CHECK((e.find("cl_") != std::string::npos
             || e.find("EVAL") != std::string::npos
             || e.find("HGETALL") != std::string::npos));
    }
    // A manual failover waits for the replica: no acknowledged checkpoint
    // write was lost behind the conversation's back.
    CHECK(c->refused == 0);
    auto log = store.messages(c->chat(), 100'000'000);
    REQUIRE(log.size() == static_cast<std::size_t>(c->steps()));
    for (size_t i = 0; i < log.size(); ++i) {
      CHECK(log[i].seq == i + 1);
      CHECK(log[i].text == std::to_string(i + 1));
    }
    auto cp = store.get_checkpoint(c->chat());
    REQUIRE(cp);
    CHECK(cp->state == R"({"n":)" + std::to_string(c->steps()) + "}");
  }
  // Thousands of entries per chat: gone, so later scans stay short.
  for (auto& c : convs) {
    store.delete_chat(c->chat());
    store.clear_checkpoint(c->chat());
  }
}
