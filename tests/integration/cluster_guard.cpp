// Linked into the cluster test executables: before each test case the
// cluster must be whole (test::ensure_whole_cluster), so a test that left it
// unable to heal fails alone and the ones after it start from a whole
// cluster, not on CLUSTERDOWN.

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "../listener_base.hpp"
#include "redis_cluster.hpp"

namespace {

struct cluster_guard : test::listener_base {
  explicit cluster_guard(const doctest::ContextOptions&) {
    // nop
  }

  void test_case_start(const doctest::TestCaseData& tc) override {
    try {
      test::ensure_whole_cluster();
    } catch (const std::exception& e) {
      // A listener cannot fail the test: the process ends, which ctest
      // reports as this test's failure, with the reason.
      std::fprintf(stderr, "before \"%s\": %s\n", tc.m_name, e.what());
      std::exit(3);
    }
  }
};

} // namespace

REGISTER_LISTENER("cluster_guard", 1, cluster_guard);
