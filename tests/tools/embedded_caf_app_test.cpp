// The embedded_caf_app example as a process: an application actor delivers
// messages to a bot in its actor system through the bot's typed actor, gets
// the answers through its subscription, and refused messages back as
// botmesh errors that name the field.

#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tools/process.hpp"

namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in{s};
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

bool has_line(const std::vector<std::string>& ls, const std::string& l) {
  for (auto& x : ls)
    if (x == l)
      return true;
  return false;
}

bool has_line_starting(const std::vector<std::string>& ls,
                       const std::string& prefix) {
  for (auto& x : ls)
    if (x.starts_with(prefix))
      return true;
  return false;
}

} // namespace

TEST_CASE("embedded_caf_app gets the bot's answers through its actor "
          "interface and refusals back as errors naming the field") {
  auto r = test::run(EMBEDDED_CAF_APP, {});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.rc == 0);
  auto out = lines(r.out);
  // Receipts: the platform id kept, a stamped one, the redelivery.
  CHECK(has_line(out, "receipt m-1 (new)"));
  CHECK(has_line(out, "receipt m-1 (duplicate)"));
  std::string stamped;
  for (auto& l : out)
    if (l.starts_with("receipt app-") && l.ends_with(" (new)"))
      stamped = l.substr(8, l.size() - 8 - 6);
  REQUIRE_FALSE(stamped.empty());
  // The answers came to the application's actor, each to its receipt's id:
  // the example's provider sends nothing anywhere else.
  CHECK(has_line(out, "answer to m-1 in ana: ¡Hola! Soy el bot de la "
                      "aplicación."));
  CHECK(has_line(out, "answer to " + stamped + " in ana: Dijiste: ¿qué hora "
                      "es?"));
  // Printed once every request was answered and every answer came.
  REQUIRE_FALSE(out.empty());
  CHECK(out.back() == "2 answers through the bot's actor");
  // Refusals: a caf::error of the botmesh category, rendered by name.
  CHECK(has_line_starting(out, "refused: botmesh.invalid_argument: inbound "
                               "message has an empty \"chat\""));
  CHECK(has_line(out, "refused: botmesh.invalid_argument: inbound message "
                      "text is 2000 bytes, over the limit of 1024 bytes "
                      "(chat ana)"));
}
