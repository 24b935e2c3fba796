#pragma once

// Included by each test executable's main.cpp: a run whose filter matched no
// test case fails. CTest runs one case per process by name
// (doctest_discover_tests); a name that CMake splits (a ';' is its list
// separator) or that the filter cannot match would otherwise "pass" with
// nothing run.

#include <doctest/doctest.h>

#include "listener_base.hpp"

#include <cstdio>
#include <cstdlib>

namespace test {

struct no_empty_run : listener_base {
  explicit no_empty_run(const doctest::ContextOptions&) {
    // nop
  }

  // Not called for queries (--list-test-cases), only for runs.
  void test_run_end(const doctest::TestRunStats& stats) override {
    if (stats.numTestCasesPassingFilters == 0) {
      std::fputs("no test case matched the filters: nothing ran\n", stderr);
      std::fflush(stdout);
      std::exit(2);
    }
  }
};

} // namespace test

REGISTER_LISTENER("no_empty_run", 0, test::no_empty_run);
