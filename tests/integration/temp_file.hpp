#pragma once

#include <cstdlib>
#include <string>

#include <unistd.h>

namespace test {

/// A fresh path in /tmp, removed (with SQLite's -wal/-shm files) on exit.
class temp_file {
 public:
  temp_file() {
    char tmpl[] = "/tmp/botmesh-test-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd >= 0)
      ::close(fd);
    path_ = tmpl;
  }

  ~temp_file() {
    for (auto suffix : {"", "-wal", "-shm", "-journal"})
      ::unlink((path_ + suffix).c_str());
  }

  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;

  const std::string& path() const noexcept {
    return path_;
  }

 private:
  std::string path_;
};

} // namespace test
