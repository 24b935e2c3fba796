#include <doctest/doctest.h>

#include <set>

#include <cmath>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/deep_to_string.hpp>

#include <botmesh/runtime/core/checkpoint.hpp>
#include <botmesh/runtime/core/error.hpp>
#include <botmesh/runtime/core/internal/delivery_id.hpp>
#include <botmesh/runtime/core/internal/text.hpp>
#include <botmesh/stores/durable_backend.hpp>
#include <botmesh/runtime/core/json.hpp>
#include <botmesh/runtime/core/message.hpp>

using botmesh::inbound_message;

namespace {

inbound_message sample() {
  inbound_message m;
  m.id = "wamid.1";
  m.provider = "whatsapp";
  m.chat = "34600:group";
  m.participant = "34611";
  m.sender = "34611";
  m.text = "Hola \"mundo\"\n\t¿qué tal? 👋 \x01";
  m.type = botmesh::message_type::text;
  m.timestamp = botmesh::from_unix_ms(1'700'000'123'456);
  m.raw = R"({"entry":[1]})";
  return m;
}

botmesh::flow_checkpoint sample_checkpoint() {
  botmesh::flow_checkpoint cp;
  cp.key = "whatsapp:34600%3Agroup:34611";
  cp.flow = "pedido";
  cp.step = "confirmar";
  cp.waiting = true;
  cp.question = 2;
  cp.state = R"({"producto":"empanada de ñame","emoji":"🥟","n":[1,2.5,null],"ok":true})";
  cp.revision = 42;
  cp.created_at = botmesh::from_unix_ms(1000);
  cp.updated_at = botmesh::from_unix_ms(2000);
  cp.fingerprint = "abc123";
  cp.ephemeral = true;
  cp.expires_at = botmesh::from_unix_ms(3000);
  cp.saved_answer = sample();
  cp.answer_ref = "";
  return cp;
}

template <class F>
std::string corrupted_message(F&& fn) {
  try {
    fn();
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::corrupted_record);
    return e.what();
  }
  FAIL("expected a corrupted_record error");
  return {};
}

} // namespace

TEST_CASE("chat keys are per participant in groups and never ambiguous") {
  inbound_message m;
  m.provider = "telegram";
  m.chat = "123";
  CHECK(botmesh::chat_key(m) == "telegram:123");
  m.participant = "77";
  CHECK(botmesh::chat_key(m) == "telegram:123:77");
  // A ':' inside an id cannot forge another chat's key.
  CHECK(botmesh::chat_key("p", "a:b") != botmesh::chat_key("p", "a", "b"));
  CHECK(botmesh::chat_key("p", "a:b") == "p:a%3Ab");
  CHECK(botmesh::chat_key("p", "50%") == "p:50%25");
}

TEST_CASE("validation names the bad field of an inbound message") {
  botmesh::message_limits limits{.max_text_bytes = 10, .max_id_bytes = 8};
  auto field_of = [&](inbound_message m) -> std::string {
    try {
      botmesh::validate(m, limits);
    } catch (const botmesh::invalid_argument_error& e) {
      return e.field();
    }
    return "ok";
  };
  inbound_message ok;
  ok.provider = "p";
  ok.chat = "c";
  ok.text = "hola";
  CHECK(field_of(ok) == "ok");
  auto m = ok;
  m.chat = "";
  CHECK(field_of(m) == "chat");
  m = ok;
  m.provider = "";
  CHECK(field_of(m) == "provider");
  m = ok;
  m.text = std::string(11, 'x');
  CHECK(field_of(m) == "text");
  m = ok;
  m.text = "\xff\xfe";
  CHECK(field_of(m) == "text");
  m = ok;
  m.chat = std::string(9, 'c');
  CHECK(field_of(m) == "chat");
  m = ok;
  m.participant = std::string(9, 'p');
  CHECK(field_of(m) == "participant");
  // Bytes that are not UTF-8 would be rewritten by a JSON round trip.
  m = ok;
  m.chat = "c\xc3";
  CHECK(field_of(m) == "chat");
  m = ok;
  m.id = "\xed\xa0\x80"; // a UTF-16 surrogate encoded in UTF-8
  CHECK(field_of(m) == "id");
  m = ok;
  m.sender = "\xc0\xaf"; // overlong
  CHECK(field_of(m) == "sender");
  m = ok;
  m.participant = "\xff";
  CHECK(field_of(m) == "participant");
  m = ok;
  m.provider = "p\x80";
  CHECK(field_of(m) == "provider");
  m = ok;
  m.raw = "{\"a\":\"\xfe\"}";
  CHECK(field_of(m) == "raw");
  m = ok;
  m.chat = "ñandú";
  m.id = "id-€";
  CHECK(field_of(m) == "ok");
  try {
    m = ok;
    m.chat = "c\xc3";
    botmesh::validate(m, limits);
  } catch (const botmesh::invalid_argument_error& e) {
    // The message names the field and does not echo the bad bytes.
    CHECK(std::string{e.what()} == "inbound message field \"chat\" is not valid UTF-8");
  }
}

TEST_CASE("an inbound message round-trips through its JSON encoding") {
  auto m = sample();
  auto json = botmesh::to_json(m);
  CHECK(botmesh::is_valid_json(json));
  CHECK(botmesh::inbound_message_from_json(json) == m);
}

TEST_CASE("an inbound message's button, media, location and edit fields "
          "round-trip through JSON, and older records without them still read") {
  auto m = sample();
  m.type = botmesh::message_type::location;
  m.data = "order:42";
  m.command = "start";
  m.media_id = "AgAD";
  m.media_url = "https://example.org/a.jpg";
  m.mime_type = "image/jpeg";
  m.latitude = 40.416775;
  m.longitude = -3.70379;
  m.edited = true;
  m.edit_id = "731";
  auto json = botmesh::to_json(m);
  CHECK(botmesh::is_valid_json(json));
  CHECK(botmesh::inbound_message_from_json(json) == m);
  // A record written before these fields existed.
  auto old = sample();
  auto old_json = botmesh::to_json(old);
  CHECK(old_json.find("\"data\"") == std::string::npos);
  CHECK(botmesh::inbound_message_from_json(old_json) == old);
  // A mistyped optional field is named.
  auto bad = old_json;
  bad.insert(bad.size() - 1, ",\"lat\":\"north\"");
  CHECK(corrupted_message([&] { botmesh::inbound_message_from_json(bad); })
          .find("\"lat\"")
        != std::string::npos);
}

TEST_CASE("a location that is not finite or not on the globe is refused, "
          "by validation and where it would become JSON") {
  struct bad {
    double lat, lon;
    const char* field;
  };
  for (auto b : {bad{std::nan(""), 1.0, "latitude"},
                 bad{1.0, HUGE_VAL, "longitude"}, bad{91.0, 1.0, "latitude"},
                 bad{1.0, -180.5, "longitude"}}) {
    // (No structured binding: clang's CAPTURE lambda cannot capture one.)
    std::string field = b.field;
    CAPTURE(field);
    auto m = sample();
    m.type = botmesh::message_type::location;
    m.latitude = b.lat;
    m.longitude = b.lon;
    try {
      botmesh::validate(m, {});
      FAIL("validated");
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == field);
    }
    // A middleware's edit is not validated again: the encoding refuses
    // what no reader would take back (a journal record, a saved answer).
    CHECK_THROWS_AS(botmesh::to_json(m), botmesh::invalid_argument_error);
    auto cp = sample_checkpoint();
    cp.saved_answer = m;
    CHECK_THROWS_AS(botmesh::to_json(cp), botmesh::invalid_argument_error);
  }
  auto m = sample();
  m.latitude = -90;
  m.longitude = 180;
  CHECK_NOTHROW(botmesh::validate(m, {}));
  CHECK(botmesh::inbound_message_from_json(botmesh::to_json(m)) == m);
}

TEST_CASE("validation names an inbound message's oversized button data and "
          "media fields") {
  botmesh::message_limits limits{.max_text_bytes = 10, .max_id_bytes = 8};
  inbound_message m;
  m.provider = "p";
  m.chat = "c";
  m.data = std::string(9, 'd');
  try {
    botmesh::validate(m, limits);
    FAIL("expected invalid data");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "data");
  }
  m.data.clear();
  m.media_url = std::string(11, 'u');
  try {
    botmesh::validate(m, limits);
    FAIL("expected invalid media_url");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "media_url");
  }
}

TEST_CASE("validation names the bad field of an outgoing message with "
          "buttons or media") {
  auto field_of = [](botmesh::outgoing_message m) -> std::string {
    try {
      botmesh::validate(m);
    } catch (const botmesh::invalid_argument_error& e) {
      return e.field();
    }
    return "ok";
  };
  botmesh::outgoing_message ok;
  ok.chat = "c";
  ok.text = "hola";
  CHECK(field_of(ok) == "ok");
  auto m = ok;
  m.chat.clear();
  CHECK(field_of(m) == "chat");
  m = ok;
  m.text.clear();
  CHECK(field_of(m) == "text");
  m.buttons = {{{.text = "Sí", .data = "yes"}}};
  CHECK(field_of(m) == "ok");
  m.buttons = {{{.text = "", .data = "yes"}}};
  CHECK(field_of(m) == "buttons");
  m.buttons = {{{.text = "Sí"}}};
  CHECK(field_of(m) == "buttons");
  m = ok;
  m.media = botmesh::message_type::image;
  CHECK(field_of(m) == "media");
  m.media_url = "https://example.org/a.png";
  CHECK(field_of(m) == "ok");
  m.media = botmesh::message_type::location;
  CHECK(field_of(m) == "media");
  // Bytes that are not UTF-8 would go out rewritten (button data coming
  // back from a press would match no route).
  m = ok;
  m.buttons = {{{.text = "A", .data = "\xff"}}};
  CHECK(field_of(m) == "buttons");
  m.buttons = {{{.text = "\xc3", .data = "a"}}};
  CHECK(field_of(m) == "buttons");
  m = ok;
  m.media = botmesh::message_type::image;
  m.media_url = "https://example.org/\xff.png";
  CHECK(field_of(m) == "media_url");
  m = ok;
  m.reply_to = "\xfe";
  CHECK(field_of(m) == "reply_to");
}

TEST_CASE("JSON strings escape control characters and replace invalid UTF-8") {
  CHECK(botmesh::json_quote("a\"b\\c\n\x01") == R"("a\"b\\c\n\u0001")");
  auto bad = botmesh::json_quote("ok\xff");
  CHECK(botmesh::is_valid_json(bad));
  CHECK(bad == "\"ok\xEF\xBF\xBD\"");
  CHECK(botmesh::json_quote("ñ👋") == "\"ñ👋\"");
}

TEST_CASE("a checkpoint round-trips through JSON, unicode state included") {
  auto cp = sample_checkpoint();
  auto json = botmesh::to_json(cp);
  INFO(json);
  CHECK(json.rfind("{\"v\":1,", 0) == 0);
  auto back = botmesh::checkpoint_from_json(json);
  CHECK(back == cp);
  // The state is embedded as a JSON value, not as a quoted string.
  CHECK(json.find(R"("state":{"producto":"empanada de ñame")") != std::string::npos);
  cp.saved_answer.reset();
  cp.answer_ref = "journal:9";
  CHECK(botmesh::checkpoint_from_json(botmesh::to_json(cp)) == cp);
}

TEST_CASE("checkpoint encoding refuses a non-JSON state and an oversize answer") {
  auto cp = sample_checkpoint();
  cp.state = "{\"a\":";
  try {
    botmesh::to_json(cp);
    FAIL("encoded an invalid state");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "state");
  }
  cp = sample_checkpoint();
  cp.saved_answer->text = std::string(botmesh::default_max_answer_bytes, 'x');
  try {
    botmesh::to_json(cp);
    FAIL("embedded an oversize answer");
  } catch (const botmesh::invalid_argument_error& e) {
    CHECK(e.field() == "saved_answer");
  }
  CHECK_NOTHROW(botmesh::to_json(cp, 64 * 1024));
  // A state nested as deep as a reader allows would make a checkpoint no
  // reader takes back: whatever is encoded decodes.
  int refused = 0;
  for (int k = 1000; k <= 1030; ++k) {
    CAPTURE(k);
    cp = sample_checkpoint();
    cp.state = std::string(k, '[') + "0" + std::string(k, ']');
    try {
      auto json = botmesh::to_json(cp);
      CHECK(botmesh::checkpoint_from_json(json).state == cp.state);
    } catch (const botmesh::invalid_argument_error& e) {
      CHECK(e.field() == "state");
      ++refused;
    }
  }
  CHECK(refused > 0);
  CHECK(refused < 31);
  // The bound holds for a state larger than the first buffer, too.
  cp = sample_checkpoint();
  cp.state = std::string(1023, '[') + "\"" + std::string(8000, 'x') + "\""
             + std::string(1023, ']');
  CHECK_THROWS_AS(botmesh::to_json(cp), botmesh::invalid_argument_error);
}

TEST_CASE("a corrupted checkpoint record gives an error naming what is wrong") {
  auto what = corrupted_message([] { botmesh::checkpoint_from_json("garbage{"); });
  CHECK(what.find("checkpoint: not valid JSON") != std::string::npos);
  what = corrupted_message([] { botmesh::checkpoint_from_json("[1,2]"); });
  CHECK(what.find("expected a JSON object") != std::string::npos);
  auto json = botmesh::to_json(sample_checkpoint());
  auto no_flow = json;
  no_flow.replace(no_flow.find("\"flow\""), 6, "\"wolf\"");
  what = corrupted_message([&] { botmesh::checkpoint_from_json(no_flow); });
  CHECK(what.find("field \"flow\" is missing") != std::string::npos);
  auto bad_rev = json;
  bad_rev.replace(bad_rev.find("\"revision\":42"), 13, "\"revision\":\"x\"");
  what = corrupted_message([&] { botmesh::checkpoint_from_json(bad_rev); });
  CHECK(what.find("field \"revision\"") != std::string::npos);
  auto bad_version = json;
  bad_version.replace(0, 7, "{\"v\":9,");
  what = corrupted_message([&] { botmesh::checkpoint_from_json(bad_version); });
  CHECK(what.find("unknown encoding version 9") != std::string::npos);
  what = corrupted_message([] { botmesh::checkpoint_from_json(""); });
  CHECK(!what.empty());
}

TEST_CASE("a checkpoint travels as a CAF message (binary inspect round-trip)") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto cp = sample_checkpoint();
  std::vector<char> buf;
  {
    caf::binary_serializer sink{sys, buf};
    auto copy = cp;
    REQUIRE(!sink(copy));
  }
  botmesh::flow_checkpoint back;
  {
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(back));
  }
  CHECK(back == cp);
  CHECK(caf::deep_to_string(cp).find("pedido") != std::string::npos);
}

TEST_CASE("messages with buttons, media and location travel as CAF messages "
          "(binary inspect round-trip)") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto in = sample();
  in.type = botmesh::message_type::button;
  in.data = "yes";
  in.latitude = 1.5;
  in.edited = true;
  botmesh::outgoing_message out;
  out.chat = "c";
  out.text = "¿Seguro?";
  out.buttons = {{{.text = "Sí", .data = "yes"}, {.text = "No", .data = "no"}},
                 {{.text = "Web", .url = "https://example.org"}}};
  out.media = botmesh::message_type::image;
  out.media_id = "AgAD";
  out.format = botmesh::text_format::html;
  out.quote = true;
  std::vector<char> buf;
  {
    caf::binary_serializer sink{sys, buf};
    auto a = in;
    auto b = out;
    REQUIRE(!sink(a, b));
  }
  inbound_message in_back;
  botmesh::outgoing_message out_back;
  {
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(in_back, out_back));
  }
  CHECK(in_back == in);
  CHECK(out_back == out);
}

TEST_CASE("join puts the separator between the parts, empty ones too") {
  using botmesh::internal::delivery_id;
  using botmesh::internal::join;
  CHECK(join('#', {"test:ana", "m1"}) == "test:ana#m1");
  CHECK(join('-', {"test", "ab12", "7"}) == "test-ab12-7");
  CHECK(join('-', {"", "x", ""}) == "-x-");
  CHECK(join('-', {"solo"}) == "solo");
  CHECK(join('-', {}).empty());
  CHECK(botmesh::journal_id("test:ana", "m1") == "test:ana#m1");
  // An edit shares its original's id; its journal id does not.
  botmesh::inbound_message m;
  m.id = "m1";
  CHECK(botmesh::journal_id("test:ana", delivery_id(m)) == "test:ana#m1");
  m.edited = true;
  CHECK(botmesh::journal_id("test:ana", delivery_id(m)) == "test:ana#m1");
  m.edit_id = "731";
  CHECK(botmesh::journal_id("test:ana", delivery_id(m)) == "test:ana#m1~731");
  // Parts that hold the separator (a custom provider's) are escaped: two
  // pairs never make one id, and a plain id is never an escaped one.
  CHECK(botmesh::journal_id("x:a#b", "c") == "x:a\\#b#c");
  CHECK(botmesh::journal_id("x:a", "b#c") == "x:a#b\\#c");
  CHECK(botmesh::journal_id("x:a\\", "#c") == "x:a\\\\#\\#c");
  CHECK(botmesh::journal_id("x:a\\#", "c") == "x:a\\\\\\##c");
  // So are ids that hold the edit separator: an edit and a message whose
  // id spells it stay two deliveries, and a plain id never meets an escaped
  // one.
  std::set<std::string> deliveries;
  for (auto id : {"a", "a~b", "a\\", "a\\~", "~", "b"})
    for (auto edit : {"", "b", "~b", "\\", "b~"}) {
      botmesh::inbound_message d;
      d.id = id;
      d.edited = *edit != 0;
      d.edit_id = edit;
      CHECK(deliveries.insert(delivery_id(d)).second);
    }
  m.id = "a~b";
  m.edit_id = "c";
  CHECK(delivery_id(m) == "a\\~b~c");
  m.edited = false;
  CHECK(delivery_id(m) == "a\\~b");
  std::set<std::string> ids;
  for (auto key : {"x:a#b", "x:a", "x:a#", "x:a\\", "x:a\\#"})
    for (auto id : {"c", "b#c", "#c", "\\#c", "b\\#c", "c\\"})
      CHECK(ids.insert(botmesh::journal_id(key, id)).second);
}
