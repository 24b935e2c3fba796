// Linked into the cluster test executables: before each test case the
// cluster must be whole (test::ensure_whole_cluster), so a test that left it
// unable to heal fails alone and the ones after it start from a whole
// cluster, not on CLUSTERDOWN.

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "redis_cluster.hpp"

namespace {

struct cluster_guard : doctest::IReporter {
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

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

} // namespace

REGISTER_LISTENER("cluster_guard", 1, cluster_guard);
