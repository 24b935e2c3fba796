// The boxes chat events travel in: recycled through a cache that any
// thread frees into and any thread takes from.

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <botmesh/actors/chat_services.hpp>

namespace {

botmesh::event_ptr box_for(const std::string& chat, const std::string& text) {
  botmesh::inbound_message m;
  m.provider = "test";
  m.chat = chat;
  m.text = text;
  return botmesh::make_event(botmesh::chat_event{std::move(m), 0, {}});
}

} // namespace

TEST_CASE("an event box freed on another thread is the next one made") {
  // Without the cache the heap would keep the block on the freeing
  // thread's side, and the maker would get a fresh one.
  // Boxes other tests freed may wait in the cache: taking more than it
  // holds leaves it empty, so the next box taken is the one freed below.
  std::vector<botmesh::event_ptr> drain;
  for (int i = 0; i < 3000; ++i)
    drain.push_back(box_for("d", "d"));
  auto a = box_for("x", "one");
  auto* where = a.get();
  std::thread{[a = std::move(a)]() mutable { a.reset(); }}.join();
  auto b = box_for("y", "two");
  CHECK(b.get() == where);
  // A recycled box is a fresh event: nothing of the last one is left.
  CHECK(b->key == botmesh::chat_key("test", "y"));
  CHECK(b->ev.message.text == "two");
  CHECK(b->ev.journal.empty());
  CHECK_FALSE(b->first);
}

TEST_CASE("event boxes made and freed on many threads at once keep their "
          "contents") {
  // Makers on some threads, freeing on others (as intake and handler
  // threads do), with the cache both full and empty along the way.
  constexpr int makers = 3;
  constexpr int per_maker = 20000;
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < makers; ++t) {
    threads.emplace_back([&, t] {
      std::vector<botmesh::event_ptr> held;
      for (int i = 0; i < per_maker; ++i) {
        auto text = std::to_string(t) + ":" + std::to_string(i)
                    + std::string(static_cast<std::size_t>(i % 40), 'z');
        held.push_back(box_for("c" + std::to_string(t), text));
        if (held.size() == 1500 || i + 1 == per_maker) {
          // Free on another thread, checking each box first.
          std::thread freer{[&, t, moved = std::move(held)]() mutable {
            for (auto& b : moved)
              if (b->key != botmesh::chat_key("test", "c" + std::to_string(t))
                  || b->ev.message.text.rfind(std::to_string(t) + ":", 0) != 0)
                ++corrupt;
            moved.clear();
          }};
          freer.join();
          held.clear();
        }
      }
    });
  }
  for (auto& th : threads)
    th.join();
  CHECK(corrupt.load() == 0);
}

TEST_CASE("an event reports its end once: moving it hands the notice on, "
          "and one let go before its end reports refused") {
  std::vector<botmesh::turn_outcome> seen;
  auto with_notice = [&] {
    botmesh::inbound_message m;
    m.chat = "c";
    botmesh::chat_event ev{std::move(m), 0, {}};
    ev.on_end = [&](botmesh::turn_outcome o) { seen.push_back(o); };
    return ev;
  };
  {
    auto ev = with_notice();
    auto moved = std::move(ev); // the moved-from event reports nothing
    CHECK(seen.empty());
    moved.end(botmesh::turn_outcome::handled);
    moved.end(botmesh::turn_outcome::failed); // once only
  }
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == botmesh::turn_outcome::handled);
  {
    auto box = botmesh::make_event(with_notice());
    CHECK(seen.size() == 1);
  } // let go without an end
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == botmesh::turn_outcome::refused);
  {
    auto a = with_notice();
    auto b = with_notice();
    a = std::move(b); // a's own event is let go: it reports refused
    CHECK(seen.size() == 3);
    a.end(botmesh::turn_outcome::handled);
  }
  REQUIRE(seen.size() == 4);
  CHECK(seen[2] == botmesh::turn_outcome::refused);
  CHECK(seen[3] == botmesh::turn_outcome::handled);
}
