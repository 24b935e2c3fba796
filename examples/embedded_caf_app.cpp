// A CAF application with a bot inside (README: "Embedding in a CAF
// application"). The application owns the actor system; one of its actors
// delivers messages to the bot through the bot's typed actor with
// request/then, and gets the bot's answers by subscribing to what it sends.
//
//   embedded_caf_app      prints each receipt, refusal and answer; exit 0
//                         once every answer came back

#include <atomic>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <botmesh/runtime/botmesh.hpp>
#include <botmesh/runtime/core/caf_error.hpp>

using namespace std::chrono_literals;

namespace {

// A transport with nothing behind it: messages come in through the bot's
// actor, and the answers go out to its subscribers.
class app_provider final : public botmesh::provider {
 public:
  std::string id() const override {
    return "app";
  }

  botmesh::provider_state state() const override {
    return state_;
  }

  void start(botmesh::provider_host& host) override {
    state_ = botmesh::provider_state::open;
    host.state_changed(state_);
  }

  void stop() override {
    state_ = botmesh::provider_state::closed;
  }

  void send(const botmesh::outgoing_message&) override {
    // nop: subscribers of topics::outgoing get the message
  }

 private:
  std::atomic<botmesh::provider_state> state_{botmesh::provider_state::closed};
};

using run_atom = caf::atom_constant<caf::atom("run")>;

struct app_state {
  botmesh::bot_actor bot;
  std::vector<botmesh::inbound_message> script;
  std::size_t next = 0;    // the next message of the script to send
  std::size_t replies = 0; // receipts and refusals so far
  std::size_t expected = 0; // answers due: one per new message accepted
  std::size_t answers = 0;
  caf::typed_response_promise<bool> done;

  static inline const char* name = "example.app";
};

using app_actor = caf::stateful_actor<app_state>;

botmesh::inbound_message text(std::string chat, std::string text,
                              std::string id = {}) {
  botmesh::inbound_message m;
  m.chat = chat;
  m.sender = std::move(chat);
  m.text = std::move(text);
  m.id = std::move(id); // empty: the bot stamps one
  return m;
}

void finish_if_done(app_actor* self) {
  auto& st = self->state;
  if (st.replies == st.script.size() && st.answers == st.expected
      && st.done.pending()) {
    caf::aout(self) << st.answers << " answers through the bot's actor"
                    << std::endl;
    st.done.deliver(true);
  }
}

// One message at a time: the next leaves once the bot answered this one.
void send_next(app_actor* self) {
  auto& st = self->state;
  if (st.next == st.script.size())
    return finish_if_done(self);
  auto msg = st.script[st.next++];
  self->request(st.bot, 5s, msg)
    .then(
      [=](const botmesh::delivery_receipt& r) {
        caf::aout(self) << "receipt " << r.id
                        << (r.duplicate ? " (duplicate)" : " (new)")
                        << std::endl;
        if (!r.duplicate)
          ++self->state.expected;
        ++self->state.replies;
        send_next(self);
      },
      [=](caf::error& e) {
        // A refusal: botmesh::code_of(e) is the errc, the text names the
        // field; configure_actor_system makes it render by name.
        caf::aout(self) << "refused: " << self->system().render(e)
                        << std::endl;
        ++self->state.replies;
        send_next(self);
      });
}

caf::behavior application(app_actor* self, botmesh::bot_actor bot) {
  self->state.bot = bot;
  self->state.script = {
    text("ana", "hola", "m-1"),
    text("ana", "¿qué hora es?"),
    text("ana", "hola", "m-1"),          // the platform delivered it again
    text("", "sin chat"),                // refused: no chat
    text("ana", std::string(2000, 'x')), // refused: over max_text_bytes
  };
  return {
    [=](run_atom) -> caf::result<bool> {
      self->state.done = self->make_response_promise<bool>();
      // Subscribed (the answer came) before the first message leaves.
      self
        ->request(bot, 5s, botmesh::subscribe_atom::value,
                  caf::actor_cast<caf::actor>(self), botmesh::topics::outgoing)
        .then([=](bool) { send_next(self); },
              [=](caf::error& e) { self->state.done.deliver(std::move(e)); });
      return self->state.done;
    },
    // What the bot sent: its answers, in each chat's order.
    [=](const botmesh::outgoing_message& m) {
      caf::aout(self) << "answer to " << m.reply_to << " in " << m.chat << ": "
                      << m.text << std::endl;
      ++self->state.answers;
      finish_if_done(self);
    },
  };
}

} // namespace

int main() {
  caf::actor_system_config cfg;
  botmesh::configure_actor_system(cfg); // botmesh errors render by name
  botmesh::configure_scheduler(cfg);    // the settings a bot uses for its own
  caf::actor_system sys{cfg};
  int rc = 1;
  {
    botmesh::bot bot{sys,
                     {.provider = std::make_shared<app_provider>(),
                      .limits = {.max_text_bytes = 1024}}};
    bot.hears({"hola"}, [](botmesh::context& c) {
      c.reply("¡Hola! Soy el bot de la aplicación.");
    });
    bot.on_message(
      [](botmesh::context& c) { c.reply("Dijiste: " + c.text()); });
    bot.start();
    auto app = sys.spawn(application, bot.actor());
    caf::scoped_actor self{sys};
    self->request(app, 30s, run_atom::value)
      .receive([&](bool ok) { rc = ok ? 0 : 1; },
               [&](caf::error& e) {
                 std::cerr << "embedded_caf_app: " << sys.render(e) << '\n';
               });
    bot.stop();
    caf::anon_send_exit(app, caf::exit_reason::user_shutdown);
  }
  return rc;
}
