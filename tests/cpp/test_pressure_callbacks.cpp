// PressureCallbacks (pressure_callbacks.hpp): watermark and reclaim callbacks, run with no
// lock held, a throwing callback counted and never propagated. The pool-level behaviour
// (pressure measured, callbacks run around allocations) is in test_watermarks.cpp.
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gpukeeper/memory/pressure_callbacks.hpp"
#include "test_support.hpp"

using gpukeeper::detail::PressureCallbacks;
using namespace gktest;

TEST_CASE("pressure callbacks: a watermark fires once per crossing and re-arms below",
          "[watermarks][pressure_callbacks]") {
  PressureCallbacks callbacks;
  CHECK_FALSE(callbacks.has_watermarks());
  std::vector<double> fired;
  const int id = callbacks.add_watermark(0.5, [&](double p) { fired.push_back(p); });
  CHECK(callbacks.has_watermarks());
  callbacks.notify(0.4);
  CHECK(fired.empty());
  callbacks.notify(0.5);  // reaching the level is crossing it
  callbacks.notify(0.9);  // still above: no second call
  REQUIRE(fired.size() == 1);
  CHECK(fired[0] == 0.5);
  callbacks.notify(0.3);  // re-arms
  callbacks.notify(0.7);
  CHECK(fired.size() == 2);
  CHECK(callbacks.remove_watermark(id));
  CHECK_FALSE(callbacks.remove_watermark(id));
  CHECK_FALSE(callbacks.has_watermarks());
  callbacks.notify(0.1);
  callbacks.notify(1.0);
  CHECK(fired.size() == 2);
  CHECK(callbacks.errors() == 0);
}

TEST_CASE("pressure callbacks: bad levels and empty callbacks are refused",
          "[watermarks][pressure_callbacks]") {
  PressureCallbacks callbacks;
  for (double level : {0.0, -0.1, 1.5, std::nan("")}) {
    INFO("level " << level);
    CHECK_THROWS_AS(callbacks.add_watermark(level, [](double) {}), InvalidInputError);
  }
  CHECK_THROWS_AS(callbacks.add_watermark(0.5, nullptr), InvalidInputError);
  CHECK_THROWS_AS(callbacks.add_reclaimer(nullptr), InvalidInputError);
  CHECK_FALSE(callbacks.has_watermarks());
  CHECK_FALSE(callbacks.remove_reclaimer(1));
}

TEST_CASE("pressure callbacks: reclaimers' bytes add up, and what throws is counted",
          "[watermarks][pressure_callbacks]") {
  PressureCallbacks callbacks;
  std::vector<std::size_t> asked;
  const int a = callbacks.add_reclaimer([&](std::size_t needed) {
    asked.push_back(needed);
    return std::size_t{100};
  });
  callbacks.add_reclaimer([](std::size_t) -> std::size_t { throw std::runtime_error("no"); });
  const int c = callbacks.add_reclaimer([](std::size_t) { return std::size_t{23}; });
  CHECK(a != c);
  CHECK(callbacks.reclaim(4096) == 123);
  CHECK(asked == std::vector<std::size_t>{4096});
  CHECK(callbacks.errors() == 1);
  CHECK(callbacks.remove_reclaimer(a));
  CHECK(callbacks.reclaim(1) == 23);
  callbacks.add_watermark(0.2, [](double) { throw std::runtime_error("no"); });
  callbacks.notify(0.5);
  CHECK(callbacks.errors() == 3);
  callbacks.count_error();  // the pool's failure to measure the pressure
  CHECK(callbacks.errors() == 4);
}

TEST_CASE("pressure callbacks: a callback may add and remove callbacks (no lock is held)",
          "[watermarks][pressure_callbacks]") {
  PressureCallbacks callbacks;
  int added = 0;
  callbacks.add_watermark(0.5, [&](double) {
    ++added;
    const int id = callbacks.add_watermark(0.9, [](double) {});
    CHECK(callbacks.remove_watermark(id));
  });
  callbacks.add_reclaimer([&](std::size_t) {
    callbacks.notify(0.6);
    return std::size_t{0};
  });
  CHECK(callbacks.reclaim(1) == 0);
  CHECK(added == 1);
}

TEST_CASE("pressure callbacks: lists changed while other threads notify and reclaim",
          "[stress][pressure_callbacks]") {
  PressureCallbacks callbacks;
  std::atomic<std::size_t> calls{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !done.load(); ++i) {
        callbacks.notify((i % 10) / 10.0 + 0.05);
        if (t == 0) callbacks.reclaim(256);
      }
    });
  }
  for (int i = 0; i < 2000; ++i) {
    const int w = callbacks.add_watermark(0.5, [&](double) { ++calls; });
    const int r = callbacks.add_reclaimer([&](std::size_t) {
      ++calls;
      return std::size_t{1};
    });
    CHECK(callbacks.remove_watermark(w));
    CHECK(callbacks.remove_reclaimer(r));
  }
  done = true;
  for (auto& t : threads) t.join();
  CHECK(callbacks.errors() == 0);
  CHECK_FALSE(callbacks.has_watermarks());
}
