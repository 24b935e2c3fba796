// Redis replies as they come off a socket (a hostile or broken server, a
// proxy): bytes fed to hiredis' reader in chunks, every complete reply
// converted with the client's conversion.
//
// Input: first byte chunk size (1-256 bytes per redisReaderFeed, so replies
// split across reads), the rest the byte stream.
//
// Contract checked: no crash, leak or UB for any stream; each converted
// reply has the shape, types, integers and texts of hiredis' reply.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <hiredis/hiredis.h>

#include <botmesh/stores/redis/internal/protocol.hpp>

#include "fuzz_check.hpp"

namespace {

void same(const redisReply* r, const botmesh::redis_reply& c) {
  using kind = botmesh::redis_reply::kind;
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR: {
      auto want = r->type == REDIS_REPLY_STRING   ? kind::string
                  : r->type == REDIS_REPLY_STATUS ? kind::status
                                                  : kind::error;
      FUZZ_CHECK(c.type == want, std::string{to_string(c.type)});
      FUZZ_CHECK(c.str == std::string(r->str, r->len), c.str);
      break;
    }
    case REDIS_REPLY_INTEGER:
      FUZZ_CHECK(c.type == kind::integer && c.integer == r->integer,
                 std::to_string(c.integer));
      break;
    case REDIS_REPLY_ARRAY:
      FUZZ_CHECK(c.type == kind::array && c.elements.size() == r->elements,
                 std::to_string(c.elements.size()));
      for (std::size_t i = 0; i < r->elements; ++i)
        same(r->element[i], c.elements[i]);
      break;
    default:
      FUZZ_CHECK(c.type == kind::nil, std::string{to_string(c.type)});
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size == 0)
    return 0;
  std::size_t chunk = std::size_t{data[0]} + 1;
  std::string_view in{reinterpret_cast<const char*>(data) + 1, size - 1};
  // The reader the client uses: array headers are bounded before the
  // reader allocates (a fuzzer-sized bound keeps the runs quick).
  redisReader* reader = redisReaderCreate();
  botmesh::internal::reader_guard guard{1 << 16};
  botmesh::internal::bound_reader(reader, &guard);
  bool failed = false;
  for (std::size_t off = 0; off < in.size() && !failed; off += chunk) {
    auto n = std::min(chunk, in.size() - off);
    if (redisReaderFeed(reader, in.data() + off, n) != REDIS_OK)
      break;
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader, &raw) != REDIS_OK) {
        FUZZ_CHECK(reader->err != 0, "an error without a code");
        failed = true;
        break;
      }
      if (raw == nullptr)
        break;
      auto r = static_cast<redisReply*>(raw);
      same(r, botmesh::internal::convert(r));
      freeReplyObject(r);
    }
  }
  redisReaderFree(reader);
  return 0;
}
