// bench_turn_latency: what a turn costs the runtime, measured through the
// lease actor as a chat actor sees it (acquire -> granted; the release is
// sent and not awaited), next to a bare PING through the same Redis client
// in the same run:
//
//   bench turn_p50 / turn_p99 us           uncontended turns on Redis
//   ratio turn_p50_vs_ping, turn_p99_vs_ping
//   bench handoff_push_p50 us               B waits while A holds a chat; A's
//   bench handoff_poll_p50 us               chat actor releases: until B's
//   ratio handoff_poll_vs_push              chat actor is told (push, and
//                                           polling only)
//   bench contended_turns_per_s             two replicas, 1k chats
//   bench evalsha_per_s                     a comparable 2-key script, same
//   ratio contended_vs_evalsha              client, same concurrency
//
// The memory hub's figures come first (no Redis needed). Redis from
// REDIS_URL; ratios are medians of interleaved rounds.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include <botmesh/actors/lease_actor.hpp>
#include <botmesh/actors/messages.hpp>
#include <botmesh/actors/router.hpp>
#include <botmesh/stores/forwarding_coordinator.hpp>
#include <botmesh/stores/memory_coordinator.hpp>
#include <botmesh/stores/redis/redis_coordinator.hpp>

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<botmesh::turn_token>)

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

std::atomic<std::uint64_t> next_req{1};

double micros(clk::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

double at(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * v.size()))];
}

double median(std::vector<double> v) {
  return at(std::move(v), 0.5);
}

// What a chat actor sends the lease actor: ask for a turn, give one back.
void acquire(caf::event_based_actor* self, const caf::actor& lease,
             const std::string& key) {
  self->send(lease, botmesh::acquire_atom::value, key, next_req.fetch_add(1));
}

void release(caf::event_based_actor* self, const caf::actor& lease,
             const botmesh::turn_token& t) {
  self->send(lease, botmesh::release_atom::value, t.key(), t.fence());
}

// Acts as a chat actor: `n` turns one after the other, each on the next of
// `chats` keys; records acquire -> granted.
caf::behavior sequential(caf::event_based_actor* self, caf::actor lease,
                         std::string prefix, int n, int chats,
                         std::shared_ptr<std::vector<double>> out,
                         std::shared_ptr<std::promise<void>> done) {
  auto i = std::make_shared<int>(0);
  auto t0 = std::make_shared<clk::time_point>();
  auto next = [=] {
    *t0 = clk::now();
    acquire(self, lease, prefix + std::to_string(*i % chats));
  };
  next();
  return {
    [=](botmesh::granted_atom, std::uint64_t,
        std::shared_ptr<botmesh::turn_token>& t) {
      out->push_back(micros(clk::now() - *t0));
      release(self, lease, *t);
      if (++*i == n) {
        done->set_value();
        self->quit();
        return;
      }
      next();
    },
    [=](botmesh::lost_atom, std::uint64_t, std::uint64_t, const std::string&) {
      next(); // not expected uncontended; keep going
    },
  };
}

// Keeps `depth` turns in flight over `chats` keys; counts grants.
caf::behavior saturating(caf::event_based_actor* self, caf::actor lease,
                         std::string prefix, int depth, int chats,
                         std::shared_ptr<std::atomic<long>> grants,
                         std::shared_ptr<std::atomic<bool>> stop) {
  auto rng = std::make_shared<std::mt19937>(std::random_device{}());
  auto another = [=] {
    acquire(self, lease, prefix + std::to_string((*rng)() % chats));
  };
  for (int k = 0; k < depth; ++k)
    another();
  return {
    [=](botmesh::granted_atom, std::uint64_t,
        std::shared_ptr<botmesh::turn_token>& t) {
      ++*grants;
      release(self, lease, *t);
      if (!stop->load())
        another();
    },
    [=](botmesh::lost_atom, std::uint64_t, std::uint64_t, const std::string&) {
      if (!stop->load())
        another();
    },
  };
}

// The coordinator without its push: grants are found by polling only.
class no_push final : public botmesh::forwarding_coordinator {
 public:
  using forwarding_coordinator::forwarding_coordinator;
  void on_grant(grant_listener) override {
    c_->on_grant([](botmesh::turn_state) {}); // dropped: polling finds it
  }
  std::uint64_t push_epoch() const noexcept override {
    return 0;
  }
};

struct replica {
  std::shared_ptr<botmesh::coordinator> coord;
  caf::actor lease;
};

replica make_replica(caf::actor_system& sys,
                     std::shared_ptr<botmesh::coordinator> c) {
  botmesh::lease_config cfg;
  cfg.coordinator = c;
  return {c, botmesh::spawn_lease_actor(sys, cfg)};
}

void shutdown(caf::actor_system& sys, replica& r) {
  caf::scoped_actor self{sys};
  self->request(r.lease, 10s, botmesh::shutdown_atom::value)
    .receive([](bool) {}, [](caf::error&) {});
}

std::vector<double> turns(caf::actor_system& sys, replica& r, int n,
                          const std::string& prefix) {
  auto out = std::make_shared<std::vector<double>>();
  out->reserve(n);
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  sys.spawn(sequential, r.lease, prefix, n, 1000, out, done);
  f.wait();
  return *out;
}

// A holds the chat; B's request waits; A releases: the time from A's chat
// actor sending the release until B's chat actor is told it has the turn.
// Both chats are event-based actors, as a bot's chat actors are: a thread
// blocked in a receive would add two wake-ups of its own to the path.
struct handoff_run {
  std::string key;
  std::vector<double> us;
  clk::time_point t0{};
  std::shared_ptr<botmesh::turn_token> held; // A's turn
};

using go_atom = caf::atom_constant<caf::atom("bm_go")>;

// A's chat: takes the turn, then releases it when told to (timing from
// here, on the actor's own thread).
caf::behavior handoff_a(caf::event_based_actor* self, caf::actor lease,
                        std::shared_ptr<handoff_run> run,
                        std::shared_ptr<std::promise<void>> held) {
  acquire(self, lease, run->key);
  return {
    [=](botmesh::granted_atom, std::uint64_t,
        std::shared_ptr<botmesh::turn_token>& t) {
      run->held = t;
      held->set_value();
    },
    [=](go_atom) {
      run->t0 = clk::now();
      release(self, lease, *run->held);
      self->quit();
    },
  };
}

// B's chat: waits for the turn; records when it is told, and releases.
caf::behavior handoff_b(caf::event_based_actor* self, caf::actor lease,
                        std::shared_ptr<handoff_run> run,
                        std::shared_ptr<std::promise<void>> told) {
  acquire(self, lease, run->key);
  return {
    [=](botmesh::granted_atom, std::uint64_t,
        std::shared_ptr<botmesh::turn_token>& t) {
      run->us.push_back(micros(clk::now() - run->t0));
      release(self, lease, *t);
      told->set_value();
      self->quit();
    },
  };
}

std::vector<double> handoffs(caf::actor_system& sys, replica& a, replica& b,
                             int n, const std::string& key) {
  auto run = std::make_shared<handoff_run>();
  run->key = key;
  for (int i = 0; i < n; ++i) {
    auto held = std::make_shared<std::promise<void>>();
    auto told = std::make_shared<std::promise<void>>();
    auto ca = sys.spawn(handoff_a, a.lease, run, held);
    held->get_future().wait();
    sys.spawn(handoff_b, b.lease, run, told);
    std::this_thread::sleep_for(2ms); // B's request is queued by now
    caf::anon_send(ca, go_atom::value);
    told->get_future().wait();
  }
  return run->us;
}

double contended(caf::actor_system& sys, replica& a, replica& b, int depth,
                 const std::string& prefix, std::chrono::milliseconds span) {
  auto grants = std::make_shared<std::atomic<long>>(0);
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto x = sys.spawn(saturating, a.lease, prefix, depth / 2, 1000, grants, stop);
  auto y = sys.spawn(saturating, b.lease, prefix, depth / 2, 1000, grants, stop);
  std::this_thread::sleep_for(200ms); // warm up
  auto g0 = grants->load();
  auto t0 = clk::now();
  std::this_thread::sleep_for(span);
  auto rate = (grants->load() - g0)
              / std::chrono::duration<double>(clk::now() - t0).count();
  stop->store(true);
  std::this_thread::sleep_for(300ms); // in-flight turns drain
  caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(y, caf::exit_reason::user_shutdown);
  return rate;
}

// The baseline: a small script of two keys in one slot (HINCRBY + a list
// push and pop), `depth` in flight through the same client.
double evalsha(botmesh::redis_client& client, int depth,
               const std::string& prefix, std::chrono::milliseconds span) {
  static const botmesh::redis_script script{
    "bench", "#!lua\nlocal n = redis.call('HINCRBY', KEYS[1], 'seq', 1)\n"
             "redis.call('RPUSH', KEYS[2], n)\nredis.call('LPOP', KEYS[2])\n"
             "redis.call('PEXPIRE', KEYS[1], 60000)\nreturn n\n"};
  client.preload(script);
  client.eval(script, {prefix + "{x}:h", prefix + "{x}:q"}, {});
  std::atomic<long> done{0};
  std::atomic<bool> stop{false};
  std::mt19937 rng{7};
  std::function<void(std::string)> issue = [&](std::string k) {
    client.eval_async(k, script, {k + ":h", k + ":q"}, {},
                      [&, k](botmesh::redis_reply, std::exception_ptr) {
                        ++done;
                        if (!stop.load())
                          issue(k);
                      });
  };
  for (int i = 0; i < depth; ++i)
    issue(prefix + "{c" + std::to_string(rng() % 1000) + "}");
  std::this_thread::sleep_for(200ms);
  auto d0 = done.load();
  auto t0 = clk::now();
  std::this_thread::sleep_for(span);
  auto rate = (done.load() - d0)
              / std::chrono::duration<double>(clk::now() - t0).count();
  stop = true;
  std::this_thread::sleep_for(300ms);
  return rate;
}

void line(const char* name, double v, const char* unit) {
  std::printf("bench %s %.1f %s\n", name, v, unit);
}

void ratio(const char* name, double v) {
  std::printf("ratio %s %.3f\n", name, v);
}

} // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  // --profile N: only N seconds of Redis contended turns (for perf).
  int profile = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string{argv[i]} == "--rounds")
      rounds = std::max(1, std::atoi(argv[i + 1]));
    if (std::string{argv[i]} == "--profile")
      profile = std::max(1, std::atoi(argv[i + 1]));
  }
  caf::actor_system_config cfg;
  // What a bot sets for its own system.
  botmesh::configure_scheduler(cfg);
  caf::actor_system sys{cfg};
  std::printf("bench_turn_latency: %d rounds\n", rounds);
  if (!profile) {
    botmesh::memory_coordination_hub hub;
    auto a = make_replica(sys, std::make_shared<botmesh::memory_coordinator>(
                                 hub, botmesh::memory_coordinator_options{
                                        .replica_id = "a"}));
    auto b = make_replica(sys, std::make_shared<botmesh::memory_coordinator>(
                                 hub, botmesh::memory_coordinator_options{
                                        .replica_id = "b"}));
    auto u = turns(sys, a, 20'000, "mu");
    line("memory_turn_p50", at(u, 0.5), "us");
    line("memory_turn_p99", at(u, 0.99), "us");
    line("memory_handoff_push_p50", median(handoffs(sys, a, b, 200, "mh")), "us");
    line("memory_contended_turns_per_s", contended(sys, a, b, 64, "mc", 1s),
         "turns/s");
    shutdown(sys, a);
    shutdown(sys, b);
  }
  auto url = std::getenv("REDIS_URL");
  if (!url) {
    std::printf("REDIS_URL not set: Redis figures not measured\n");
    return 0;
  }
  auto client = std::make_shared<botmesh::redis_client>(
    botmesh::redis_options{.url = url});
  auto prefix = "bench-turn-" + std::to_string(std::random_device{}());
  auto coord = [&](const char* id) {
    return std::make_shared<botmesh::redis_coordinator>(
      botmesh::redis_coordinator_options{.client = client, .prefix = prefix,
                                         .replica_id = id});
  };
  auto a = make_replica(sys, coord("a"));
  auto b = make_replica(sys, coord("b"));
  if (profile) {
    std::printf("contended %.0f turns/s\n",
                contended(sys, a, b, 64, prefix + ":p:",
                          std::chrono::seconds{profile}));
    shutdown(sys, a);
    shutdown(sys, b);
    return 0;
  }
  auto pa = make_replica(sys, std::make_shared<no_push>(coord("pa")));
  auto pb = make_replica(sys, std::make_shared<no_push>(coord("pb")));
  std::vector<double> p50s, p99s, pings50, pings99, push, poll, cont, eval,
    r50, r99, rhand, rcont;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> ping;
    for (int i = 0; i < 3000; ++i) {
      auto t0 = clk::now();
      client->call({"PING"});
      ping.push_back(micros(clk::now() - t0));
    }
    auto u = turns(sys, a, 3000, prefix + ":u" + std::to_string(r) + ":");
    auto ph = median(handoffs(sys, a, b, 60, prefix + ":hp" + std::to_string(r)));
    auto pl = median(handoffs(sys, pa, pb, 15, prefix + ":hl" + std::to_string(r)));
    auto c = contended(sys, a, b, 64, prefix + ":c" + std::to_string(r) + ":", 1s);
    auto e = evalsha(*client, 64, prefix + ":e" + std::to_string(r), 1s);
    p50s.push_back(at(u, 0.5));
    p99s.push_back(at(u, 0.99));
    pings50.push_back(at(ping, 0.5));
    pings99.push_back(at(ping, 0.99));
    push.push_back(ph);
    poll.push_back(pl);
    cont.push_back(c);
    eval.push_back(e);
    r50.push_back(at(u, 0.5) / at(ping, 0.5));
    r99.push_back(at(u, 0.99) / at(ping, 0.99));
    rhand.push_back(pl / ph);
    rcont.push_back(c / e);
    std::printf("  round %d: ping p50 %.0f us, turn p50 %.0f / p99 %.0f us, "
                "hand-off push %.0f / poll %.0f us, contended %.0f/s, "
                "evalsha %.0f/s\n",
                r + 1, at(ping, 0.5), at(u, 0.5), at(u, 0.99), ph, pl, c, e);
  }
  line("ping_p50", median(pings50), "us");
  line("ping_p99", median(pings99), "us");
  line("turn_p50", median(p50s), "us");
  line("turn_p99", median(p99s), "us");
  ratio("turn_p50_vs_ping", median(r50));
  ratio("turn_p99_vs_ping", median(r99));
  line("handoff_push_p50", median(push), "us");
  line("handoff_poll_p50", median(poll), "us");
  ratio("handoff_poll_vs_push", median(rhand));
  line("contended_turns_per_s", median(cont), "turns/s");
  line("evalsha_per_s", median(eval), "calls/s");
  ratio("contended_vs_evalsha", median(rcont));
  for (auto* r : {&a, &b, &pa, &pb})
    shutdown(sys, *r);
  return 0;
}
