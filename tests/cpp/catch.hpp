// Includes Catch2, whichever major version the build found (CMakeLists.txt says which):
// 3.x has <catch2/catch_all.hpp>, 2.x the single header <catch2/catch.hpp>. The tests use
// only macros both provide: TEST_CASE, SECTION, GENERATE, REQUIRE*, CHECK*, INFO, WARN.
#pragma once

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
