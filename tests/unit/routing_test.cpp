#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <botmesh/runtime/botmesh.hpp>

#include "log_capture.hpp"
#include "test_util.hpp"

// Routing that fits real updates: commands with a payload, filters by kind,
// middleware around everything a message reaches, and the warning for a
// handler an earlier one shadows.

using namespace std::chrono_literals;
using botmesh::errc;
using botmesh::message_type;

namespace {

std::vector<std::string> texts(const std::vector<botmesh::outgoing_message>& v) {
  std::vector<std::string> out;
  for (auto& m : v)
    out.push_back(m.text);
  return out;
}

botmesh::inbound_message of_type(std::string chat, message_type t,
                                 std::string text = {}) {
  botmesh::inbound_message m;
  m.chat = m.sender = std::move(chat);
  m.type = t;
  m.text = std::move(text);
  return m;
}

template <class F>
errc registration_error(F&& f, std::string* field = nullptr) {
  try {
    f();
  } catch (const botmesh::invalid_argument_error& e) {
    if (field)
      *field = e.field();
    return e.code();
  }
  return errc::none;
}

} // namespace

TEST_CASE("command() parses the command from the text, ignores case and a "
          "bot name, and gives the payload") {
  CHECK(botmesh::command_in("/start") == "start");
  CHECK(botmesh::command_in("/start ref-42") == "start");
  CHECK(botmesh::command_in("/start@my_bot ref-42") == "start");
  CHECK(botmesh::command_in("/start\nmore") == "start");
  CHECK(botmesh::command_in("start").empty());
  CHECK(botmesh::command_in("/").empty());
  CHECK(botmesh::command_in("/ start").empty());
  CHECK(botmesh::command_in("/start-now").empty());
  CHECK(botmesh::command_in("/" + std::string(33, 'a')).empty());
  CHECK(botmesh::command_in("/" + std::string(32, 'a')) == std::string(32, 'a'));

  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.command("start", [](botmesh::context& c) {
    c.reply("start[" + std::string{c.payload()} + "]");
  });
  b.command("/help", [](botmesh::context& c) { c.reply("help"); });
  b.on_message([](botmesh::context& c) {
    c.reply("eco[" + std::string{c.payload()} + "]: " + c.text());
  });
  b.start();
  p->inject("ana", "/start ref-42");
  p->inject("ana", "/START");
  p->inject("ana", "/start@my_bot   ref-9  ");
  p->inject("ana", "/help");
  p->inject("ana", "/other x");
  p->inject("ana", "start ref");
  REQUIRE(p->wait_for_sent(6, 5s));
  CHECK(texts(p->sent_to("ana"))
        == std::vector<std::string>{"start[ref-42]", "start[]", "start[ref-9]",
                                    "help", "eco[x]: /other x",
                                    "eco[]: start ref"});
}

TEST_CASE("command(), when() and use() refuse what can never work, naming "
          "the field") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  std::string field;
  auto nop = [](botmesh::context&) {};
  CHECK(registration_error([&] { b.command("", nop); }, &field)
        == errc::invalid_argument);
  CHECK(field == "command");
  CHECK(registration_error([&] { b.command("two words", nop); }, &field)
        == errc::invalid_argument);
  CHECK(field == "command");
  CHECK(registration_error([&] { b.when(nullptr, nop); }, &field)
        == errc::invalid_argument);
  CHECK(field == "filter");
  CHECK(registration_error([&] { b.use(nullptr); }, &field)
        == errc::invalid_argument);
  CHECK(field == "middleware");
  b.start();
  CHECK(registration_error(
          [&] {
            b.use([](botmesh::context&, const std::function<void()>& next) {
              next();
            });
          },
          &field)
        == errc::invalid_argument);
  CHECK(field == "handler");
  CHECK(registration_error([&] { b.command("late", nop); }, &field)
        == errc::invalid_argument);
  CHECK(field == "handler");
}

TEST_CASE("filters route by kind: media, a button's data, location, edits, "
          "and their combinations") {
  namespace f = botmesh::filters;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.when(f::edited(), [](botmesh::context& c) { c.reply("edited"); });
  b.when(f::all({f::media(), f::type(message_type::image)}),
         [](botmesh::context& c) { c.reply("image: " + c.text()); });
  b.when(f::media(), [](botmesh::context& c) {
    c.reply("media " + c.message().media_id);
  });
  b.when(f::button("yes"), [](botmesh::context& c) { c.reply("yes!"); });
  b.when(f::button(), [](botmesh::context& c) {
    c.reply("button " + c.message().data);
  });
  b.when(f::any({f::location(), f::type(message_type::contact)}),
         [](botmesh::context&c) { c.reply("where/who"); });
  b.on_message([](botmesh::context& c) { c.reply("text: " + c.text()); });
  b.start();
  auto image = of_type("ana", message_type::image, "mira");
  image.media_id = "f1";
  p->inject(image);
  auto audio = of_type("ana", message_type::audio);
  audio.media_id = "f2";
  p->inject(audio);
  auto yes = of_type("ana", message_type::button);
  yes.data = "yes";
  p->inject(yes);
  auto no = of_type("ana", message_type::button);
  no.data = "no";
  p->inject(no);
  auto loc = of_type("ana", message_type::location);
  loc.latitude = 40.4;
  p->inject(loc);
  p->inject(of_type("ana", message_type::contact, "+34600000000"));
  auto edit = of_type("ana", message_type::text, "fixed");
  edit.edited = true;
  p->inject(edit);
  p->inject("ana", "hola");
  REQUIRE(p->wait_for_sent(8, 5s));
  CHECK(texts(p->sent_to("ana"))
        == std::vector<std::string>{"image: mira", "media f2", "yes!",
                                    "button no", "where/who", "where/who",
                                    "edited", "text: hola"});
}

TEST_CASE("middleware runs in order around the handlers, may change the "
          "message, and consumes it by not calling next") {
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p}};
  errors.attach(b);
  std::mutex mtx;
  std::vector<std::string> trace;
  auto note = [&](std::string s) {
    std::lock_guard guard{mtx};
    trace.push_back(std::move(s));
  };
  b.use([&](botmesh::context& c, const std::function<void()>& next) {
    note("outer in " + c.text());
    if (c.text() == "spam")
      return; // consumed: no handler runs
    next();
    next(); // a second call runs nothing
    note("outer out");
  });
  b.use([&](botmesh::context& c, const std::function<void()>& next) {
    note("inner in " + c.text());
    if (c.message().type == message_type::audio) {
      auto& m = c.edit_message();
      m.text = "transcript of " + m.media_id;
      m.language = "es";
    }
    if (c.text() == "explode")
      throw std::runtime_error("middleware failed");
    next();
  });
  b.on_message([&](botmesh::context& c) {
    note("handler " + c.text());
    c.reply(c.text() + " [" + c.message().language + "]");
  });
  b.start();
  auto voice = of_type("ana", message_type::audio);
  voice.media_id = "v1";
  p->inject(voice);
  REQUIRE(p->wait_for_sent(1, 5s));
  p->inject("ana", "spam");
  p->inject("ana", "explode");
  p->inject("ana", "hola");
  REQUIRE(p->wait_for_sent(2, 5s));
  REQUIRE(test::eventually([&] { return b.stats().handled == 4; }));
  CHECK(texts(p->sent_to("ana"))
        == std::vector<std::string>{"transcript of v1 [es]", "hola []"});
  CHECK(errors.count(errc::handler_failed) == 1);
  std::lock_guard guard{mtx};
  CHECK(trace
        == std::vector<std::string>{
          "outer in ", "inner in ", "handler transcript of v1", "outer out",
          "outer in spam", "outer in explode", "inner in explode",
          "outer in hola", "inner in hola", "handler hola", "outer out"});
}

TEST_CASE("a handler cannot edit the message: the error names the field") {
  auto p = std::make_shared<botmesh::testing_provider>();
  test::error_log errors;
  botmesh::bot b{{.provider = p}};
  errors.attach(b);
  b.on_message([](botmesh::context& c) { c.edit_message().text = "x"; });
  b.start();
  p->inject("ana", "hola");
  REQUIRE(test::eventually(
    [&] { return errors.count(errc::handler_failed) == 1; }));
  auto all = errors.all();
  CHECK(all.at(0).what.find("only middleware") != std::string::npos);
}

TEST_CASE("middleware runs before a waiting flow: the answer is the changed "
          "message") {
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p}};
  b.use([](botmesh::context& c, const std::function<void()>& next) {
    if (c.message().type == message_type::audio)
      c.edit_message().text = "transcribed";
    next();
  });
  botmesh::flow f{"nombre"};
  f.hears({"hola"}).ask("nombre", "¿Nombre?",
                        [](botmesh::flow_context& c, const botmesh::answer& a) {
                          c.send("Hola, " + a.text());
                        });
  b.add_flow(std::move(f));
  b.start();
  p->inject("ana", "hola");
  REQUIRE(p->wait_for_sent(1, 5s));
  p->inject(of_type("ana", message_type::audio));
  REQUIRE(p->wait_for_sent(2, 5s));
  CHECK(p->sent().back().text == "Hola, transcribed");
}

TEST_CASE("a handler an earlier one shadows is warned about at registration") {
  test::log_capture cap;
  auto p = std::make_shared<botmesh::testing_provider>();
  botmesh::bot b{{.provider = p, .bot_id = "shop"}};
  auto nop = [](botmesh::context&) {};
  b.hears({"hola", "buenas"}, nop);
  b.hears("adios", nop);
  b.command("start", nop);
  b.hears(botmesh::pattern{"x+"}, nop);
  b.when(botmesh::filters::media(), nop);
  CHECK(cap.all().empty()); // nothing shadowed so far
  b.hears("HOLA", nop);
  CHECK(cap.count("bot", "handler hears(\"HOLA\") (#6) can never run: the "
                         "earlier hears(\"hola\", \"buenas\")")
        == 1);
  b.hears({"chao", "Buenas"}, nop);
  CHECK(cap.count("bot", "keyword \"Buenas\" of handler hears(\"chao\", "
                         "\"Buenas\") is taken by the earlier hears(\"hola\", "
                         "\"buenas\")")
        == 1);
  CHECK(cap.count("bot", "(#7) can never run") == 0);
  b.command("START", nop);
  CHECK(cap.count("bot", "handler command(\"START\") (#8) can never run") == 1);
  b.on_message(nop);
  b.command("help", nop);
  CHECK(cap.count("bot", "handler command(\"help\") (#10) can never run: the "
                         "earlier on_message takes every message")
        == 1);
  for (auto& c : cap.all()) {
    CHECK(c.severity == botmesh::log::level::warn);
    CHECK(c.bot == "shop");
  }
}
