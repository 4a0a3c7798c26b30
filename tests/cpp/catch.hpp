// Includes Catch2, whichever major version the build found (CMakeLists.txt says which):
// 3.x has <catch2/catch_all.hpp>, 2.x the single header <catch2/catch.hpp>. The tests use
// only macros both provide: TEST_CASE, SECTION, GENERATE, REQUIRE*, CHECK*, INFO, WARN,
// and GK_SKIP below for a test that cannot run here.
#pragma once

#include <sstream>
#include <string>

#if defined(GPUKEEPER_CATCH2_MAJOR)
#if GPUKEEPER_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
#elif __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

// GK_SKIP(message): the test case (the current generator value or section) cannot run on
// this machine; reports it as skipped and returns from the enclosing function, so use it
// in a TEST_CASE body (or a macro expanded there). `message` may use << like INFO.
//   - Catch2 >= 3.3: SKIP. Catch counts the test case as skipped, and exits with 4 when
//     every test case it ran was skipped; ctest shows that as "Skipped".
//   - Catch2 2.x, which has no SKIP: WARN("SKIPPED: ...") (the console shows it), and a
//     note to the listener in main.cpp, which lists the skipped test cases after Catch's
//     summary and exits with 4 when every test case that ran was skipped.
//   - Catch2 3.0 - 3.2: WARN("SKIPPED: ...") and a passing SUCCEED; upgrade to see skips.
#if defined(SKIP) && !defined(CATCH_CONFIG_PREFIX_ALL)
#define GK_SKIP(message) SKIP(message)
#elif defined(CATCH_VERSION_MAJOR) && CATCH_VERSION_MAJOR < 3
namespace gktest {
void note_skip(const std::string& reason);  // main.cpp
}  // namespace gktest
#define GK_SKIP(message)                          \
  do {                                            \
    std::ostringstream gk_skip_reason_;           \
    gk_skip_reason_ << message;                   \
    ::gktest::note_skip(gk_skip_reason_.str());   \
    WARN("SKIPPED: " << gk_skip_reason_.str());   \
    return;                                       \
  } while (0)
#else
#define GK_SKIP(message)                  \
  do {                                    \
    WARN("SKIPPED: " << message);         \
    SUCCEED("skipped (Catch2 < 3.3)");    \
    return;                               \
  } while (0)
#endif
