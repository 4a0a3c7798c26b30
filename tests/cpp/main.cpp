// Catch2 2.x only: the test runner's main(). Catch2 3 links Catch2::Catch2WithMain instead.
#define CATCH_CONFIG_MAIN
#include "catch.hpp"
