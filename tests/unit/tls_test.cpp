// TLS verification of the HTTPS client against a TLS server on loopback
// whose certificates (a test CA, leaves, a self-signed one) are made here
// with OpenSSL, fresh for each run.

#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <unistd.h>

#include <botmesh/providers/http/http_client.hpp>
#include <botmesh/providers/telegram/bot_api.hpp>
#include <botmesh/runtime/core/error.hpp>

namespace http = botmesh::http;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

/// A key and its certificate, made with OpenSSL's C API.
class cert {
 public:
  /// A certificate for `cn` with subjectAltName `san` ("IP:127.0.0.1",
  /// "DNS:other.example"; none when empty), signed by `issuer`, or by its
  /// own key when null. `ca` makes it a CA.
  cert(const char* cn, const char* san, bool ca, const cert* issuer)
    : key_(EVP_EC_gen("P-256"), EVP_PKEY_free), x509_(X509_new(), X509_free) {
    REQUIRE(key_);
    static int serial = 1;
    auto* x = x509_.get();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
    X509_set_pubkey(x, key_.get());
    auto* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn), -1,
                               -1, 0);
    auto* signer = issuer ? issuer->x509_.get() : x;
    X509_set_issuer_name(x, X509_get_subject_name(signer));
    add_ext(signer, NID_basic_constraints,
            ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
    add_ext(signer, NID_subject_key_identifier, "hash");
    if (ca) {
      add_ext(signer, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
      add_ext(signer, NID_key_usage, "critical,digitalSignature");
      add_ext(signer, NID_ext_key_usage, "serverAuth");
    }
    if (*san)
      add_ext(signer, NID_subject_alt_name, san);
    REQUIRE(X509_sign(x, issuer ? issuer->key_.get() : key_.get(), EVP_sha256())
            > 0);
  }

  std::string cert_pem() const {
    return pem([&](BIO* b) { return PEM_write_bio_X509(b, x509_.get()); });
  }

  std::string key_pem() const {
    return pem([&](BIO* b) {
      return PEM_write_bio_PrivateKey(b, key_.get(), nullptr, nullptr, 0,
                                      nullptr, nullptr);
    });
  }

 private:
  void add_ext(X509* signer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, signer, x509_.get(), nullptr, nullptr, 0);
    auto* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    REQUIRE(ext != nullptr);
    X509_add_ext(x509_.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }

  template <class Write>
  static std::string pem(Write write) {
    std::unique_ptr<BIO, decltype(&BIO_free)> b{BIO_new(BIO_s_mem()), BIO_free};
    REQUIRE(write(b.get()) == 1);
    char* data = nullptr;
    auto n = BIO_get_mem_data(b.get(), &data);
    return std::string(data, static_cast<std::size_t>(n));
  }

  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key_;
  std::unique_ptr<X509, decltype(&X509_free)> x509_;
};

/// A PEM file in /tmp, removed at the end.
class pem_file {
 public:
  explicit pem_file(const std::string& text) {
    char tmpl[] = "/tmp/botmesh-ca-XXXXXX";
    int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, text.data(), text.size())
            == static_cast<ssize_t>(text.size()));
    ::close(fd);
    path_ = tmpl;
  }

  ~pem_file() {
    ::unlink(path_.c_str());
  }

  const std::string& path() const {
    return path_;
  }

 private:
  std::string path_;
};

/// An HTTPS server on 127.0.0.1 (Beast + OpenSSL, one thread, one request
/// per connection) answering every request 200 with `body`.
class tls_server {
 public:
  explicit tls_server(const cert& c,
                      std::string body = R"({"ok":true,"result":true})")
    : body_(std::move(body)) {
    ctx_.use_certificate_chain(net::buffer(c.cert_pem()));
    ctx_.use_private_key(net::buffer(c.key_pem()), ssl::context::pem);
    acceptor_.open(tcp::v4());
    acceptor_.bind({net::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen();
    thread_ = std::thread{[this] { serve(); }};
  }

  ~tls_server() {
    stopping_ = true;
    // Wakes the blocking accept.
    tcp::socket s{ioc_};
    boost::system::error_code ec;
    s.connect({net::ip::make_address("127.0.0.1"), port()}, ec);
    thread_.join();
  }

  std::uint16_t port() const {
    return acceptor_.local_endpoint().port();
  }

  std::string url(const std::string& host = "127.0.0.1") const {
    return "https://" + host + ":" + std::to_string(port());
  }

  /// Requests answered (handshakes that succeeded and a request read).
  int answered() const {
    return answered_;
  }

 private:
  void serve() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket sock{ioc_};
      acceptor_.accept(sock, ec);
      if (stopping_)
        return;
      if (ec)
        continue;
      ssl::stream<tcp::socket> s{std::move(sock), ctx_};
      s.handshake(ssl::stream_base::server, ec);
      if (ec)
        continue; // the client refused our certificate
      boost::beast::flat_buffer buf;
      bhttp::request<bhttp::string_body> req;
      bhttp::read(s, buf, req, ec);
      if (ec)
        continue;
      bhttp::response<bhttp::string_body> res{bhttp::status::ok, 11};
      res.set(bhttp::field::content_type, "application/json");
      res.keep_alive(false);
      res.body() = body_;
      res.prepare_payload();
      // Counted before the answer leaves: the client may read it and check
      // the count before this thread runs again.
      ++answered_;
      bhttp::write(s, res, ec);
      s.shutdown(ec);
    }
  }

  std::string body_;
  net::io_context ioc_;
  ssl::context ctx_{ssl::context::tls_server};
  tcp::acceptor acceptor_{ioc_};
  std::atomic<bool> stopping_{false};
  std::atomic<int> answered_{0};
  std::thread thread_;
};

/// The reason of the tls_verification_error `fn` throws ("" if none).
template <class Fn>
std::string refusal(Fn fn) {
  try {
    fn();
  } catch (const http::tls_verification_error& e) {
    CHECK(e.code() == botmesh::errc::provider_error);
    MESSAGE(std::string{e.what()});
    return e.reason();
  }
  return {};
}

http::client_request get(const std::string& url) {
  return {.method = "GET", .url = url + "/"};
}

} // namespace

TEST_CASE("the HTTPS client verifies certificates by default: a self-signed "
          "one is refused with tls_verification_error") {
  cert self_signed{"127.0.0.1", "IP:127.0.0.1", false, nullptr};
  tls_server server{self_signed};
  http::client client;
  CHECK(refusal([&] { client.request(get(server.url())); })
        == "self-signed certificate");
  CHECK(server.answered() == 0);
  // The message says which server and what to do.
  try {
    client.request(get(server.url()));
  } catch (const botmesh::error& e) {
    CHECK(std::string{e.what()}
          == "http https://127.0.0.1:" + std::to_string(server.port())
               + ": the server's certificate was refused: self-signed "
                 "certificate (a private CA is trusted with "
                 "client_options.ca_file)");
  }
}

TEST_CASE("the HTTPS client trusts a private CA given in ca_file, and only "
          "for the hosts its certificates name") {
  cert ca{"botmesh test CA", "", true, nullptr};
  cert leaf{"127.0.0.1", "IP:127.0.0.1,DNS:localhost", false, &ca};
  pem_file ca_file{ca.cert_pem()};
  tls_server server{leaf};

  SUBCASE("unknown to the system's CAs: refused") {
    http::client client;
    CHECK(refusal([&] { client.request(get(server.url())); })
          == "unable to get local issuer certificate");
  }
  SUBCASE("with ca_file: accepted by IP address and by name") {
    http::client client{{.ca_file = ca_file.path()}};
    auto r = client.request(get(server.url()));
    CHECK(r.status == 200);
    CHECK(r.body == R"({"ok":true,"result":true})");
    CHECK(client.request(get(server.url("localhost"))).status == 200);
    CHECK(server.answered() == 2);
  }
  SUBCASE("with ca_file, a certificate for another host: refused") {
    cert other{"other.example", "DNS:other.example", false, &ca};
    tls_server wrong{other};
    http::client client{{.ca_file = ca_file.path()}};
    CHECK(refusal([&] { client.request(get(wrong.url())); })
          == "IP address mismatch");
    CHECK(refusal([&] { client.request(get(wrong.url("localhost"))); })
          == "hostname mismatch");
    CHECK(wrong.answered() == 0);
  }
  SUBCASE("a Telegram bot_api reaches a Bot API behind the private CA") {
    botmesh::telegram::bot_api api{{.token = "123:abc",
                                    .api_url = server.url(),
                                    .http = {.ca_file = ca_file.path()}}};
    CHECK(api.call("getMe", "{}") == "true");
  }
}

TEST_CASE("a self-signed server certificate is pinned by giving it as "
          "ca_file, and verify_tls off accepts anything (tests only)") {
  cert self_signed{"127.0.0.1", "IP:127.0.0.1", false, nullptr};
  pem_file pinned{self_signed.cert_pem()};
  tls_server server{self_signed};
  http::client pinning{{.ca_file = pinned.path()}};
  CHECK(pinning.request(get(server.url())).status == 200);
  http::client unverified{{.verify_tls = false}};
  CHECK(unverified.request(get(server.url())).status == 200);
}

TEST_CASE("a ca_file that cannot be loaded is refused when the client is "
          "made") {
  try {
    http::client client{{.ca_file = "/nonexistent/ca.pem"}};
    FAIL("no error");
  } catch (const botmesh::error& e) {
    CHECK(e.code() == botmesh::errc::provider_error);
    CHECK(std::string{e.what()}.starts_with(
      "http client: cannot load CA file /nonexistent/ca.pem"));
  }
}
