// The timing core: Timer, EventLog and EventPool, in CPU mode everywhere and on CUDA
// events where the machine has a usable device; the calibration kernels, where built.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/timing/event_log.hpp"
#include "gpukeeper/timing/event_pool.hpp"
#include "gpukeeper/timing/timer.hpp"
#include "gpukeeper/timing/timer_calibration.hpp"

using gpukeeper::DeviceError;
using gpukeeper::EventLog;
using gpukeeper::EventPool;
using gpukeeper::InvalidInputError;
using gpukeeper::kCpuDevice;
using gpukeeper::Timer;
using gpukeeper::TimedInterval;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// In a test case: skips it unless CUDA timing can run here (a usable device).
#define GK_SKIP_UNLESS_GPU()                                                          \
  do {                                                                                \
    if (gpukeeper::cuda_device_count() == 0) {                                        \
      GK_SKIP("no usable CUDA device: " << gpukeeper::cuda_status().reason);          \
    }                                                                                 \
  } while (0)

// In a test case: skips it unless this build has the calibration kernels (nvcc).
#define GK_SKIP_UNLESS_KERNELS()                                                      \
  do {                                                                                \
    if (!gpukeeper::calibration_kernels_available()) {                                \
      GK_SKIP("gpukeeper was built without the calibration kernels (no nvcc)");       \
    }                                                                                 \
  } while (0)

TEST_CASE("timing: a CPU timer reads a 20 ms sleep as 20 +- 5 ms", "[timing]") {
  Timer t(kCpuDevice);
  REQUIRE_FALSE(t.is_gpu());
  REQUIRE(t.device() == kCpuDevice);
  t.start();
  sleep_ms(20);
  t.stop();
  REQUIRE(t.ready());
  double ms = t.elapsed_ms();
  CHECK(ms >= 15.0);
  CHECK(ms <= 25.0);
  // Reading again gives the same value; a restart measures anew.
  REQUIRE(t.elapsed_ms() == ms);
  t.start();
  t.stop();
  REQUIRE(t.elapsed_ms() < 5.0);
}

TEST_CASE("timing: a timer must be started before stop and stopped before elapsed",
          "[timing]") {
  Timer t(kCpuDevice);
  REQUIRE_FALSE(t.ready());
  REQUIRE_THROWS_AS(t.stop(), InvalidInputError);
  REQUIRE_THROWS_AS(t.elapsed_ms(), InvalidInputError);
  t.start();
  REQUIRE_FALSE(t.ready());
  REQUIRE_THROWS_AS(t.elapsed_ms(), InvalidInputError);
  REQUIRE_THROWS_AS(Timer(kCpuDevice - 1), InvalidInputError);
}

TEST_CASE("timing: timers move, and a moved-from timer refuses to work", "[timing]") {
  Timer a(kCpuDevice, /*stream=*/7);
  const auto host0 = std::chrono::steady_clock::now();
  a.start();
  sleep_ms(2);
  a.stop();
  const double host_ms = ms_since(host0);  // encloses the timer's interval
  Timer b(std::move(a));
  REQUIRE(b.valid());
  REQUIRE_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): checked on purpose
  REQUIRE(b.stream() == 7);
  const double ms = b.elapsed_ms();
  REQUIRE(ms >= 2.0);
  REQUIRE(ms <= host_ms);
  REQUIRE_THROWS_AS(a.start(), InvalidInputError);
  REQUIRE_THROWS_AS(a.elapsed_ms(), InvalidInputError);
  Timer c(kCpuDevice);
  c = std::move(b);
  REQUIRE(c.elapsed_ms() == ms);  // the moved measurement, not a new one
  REQUIRE_FALSE(b.valid());
  std::vector<Timer> many;
  for (int i = 0; i < 10; ++i) many.emplace_back(kCpuDevice);  // vector growth moves them
  for (auto& t : many) {
    const auto t0 = std::chrono::steady_clock::now();
    t.start();
    t.stop();
    const double enclosing = ms_since(t0);
    REQUIRE(t.elapsed_ms() >= 0.0);
    REQUIRE(t.elapsed_ms() <= enclosing);
  }
}

TEST_CASE("timing: without a usable device every id times on the CPU", "[timing]") {
  if (gpukeeper::cuda_device_count() > 0) {
    REQUIRE(Timer(0).is_gpu());
    REQUIRE_THROWS_AS(Timer(gpukeeper::cuda_device_count()), InvalidInputError);
    return;
  }
  Timer t(0);
  REQUIRE_FALSE(t.is_gpu());
  EventLog log(0);
  REQUIRE_FALSE(log.is_gpu());
  // No pool of events either: DeviceError (no CUDA build) or InvalidInputError (no device).
  REQUIRE_THROWS_AS(EventPool::for_device(0), gpukeeper::GpuError);
}

TEST_CASE("timing: a CPU event log resolves laps and nested intervals in order", "[timing]") {
  EventLog log(kCpuDevice);
  REQUIRE_FALSE(log.is_gpu());
  const auto host0 = std::chrono::steady_clock::now();
  log.mark("origin");
  sleep_ms(5);
  log.mark("a");
  log.begin("outer");
  log.begin("inner");
  sleep_ms(10);
  log.end();  // inner
  sleep_ms(2);
  log.end();  // outer
  log.mark("b");
  // Each interval lies within this host reading, which also holds the sleeps outside it.
  const double host_ms = ms_since(host0);
  REQUIRE(log.pending() == 4);
  REQUIRE(log.open() == 0);
  REQUIRE(log.ready());
  std::vector<TimedInterval> got = log.resolve();
  REQUIRE(got.size() == 4);
  CHECK(got[0].label == "a");
  CHECK(got[1].label == "inner");
  CHECK(got[2].label == "outer");
  CHECK(got[3].label == "b");
  INFO("host time around it all: " << host_ms << " ms");
  CHECK(got[0].gpu_ms >= 5.0);
  CHECK(got[0].gpu_ms <= host_ms - 12.0);       // the 10 + 2 ms after "a" are not in it
  CHECK(got[1].gpu_ms >= 10.0);
  CHECK(got[1].gpu_ms <= host_ms - 7.0);        // nor the 5 + 2 ms around inner
  CHECK(got[2].gpu_ms >= got[1].gpu_ms + 2.0);  // outer encloses inner plus 2 ms
  CHECK(got[2].gpu_ms <= host_ms - 5.0);
  CHECK(got[3].gpu_ms >= got[2].gpu_ms);        // the lap since "a" encloses outer
  CHECK(got[3].gpu_ms <= host_ms - 5.0);
  REQUIRE(log.pending() == 0);

  // The last mark stays the origin: the next lap needs only one mark.
  sleep_ms(3);
  log.mark("c");
  const double since_start = ms_since(host0);  // "b" came 17 ms of sleeps after host0
  got = log.resolve();
  REQUIRE(got.size() == 1);
  CHECK(got[0].label == "c");
  CHECK(got[0].gpu_ms >= 3.0);
  CHECK(got[0].gpu_ms <= since_start - 17.0);

  // clear() drops the origin too.
  log.clear();
  log.mark("origin again");
  REQUIRE(log.pending() == 0);
  REQUIRE(log.resolve().empty());
}

TEST_CASE("timing: an event log refuses unbalanced intervals and keeps them", "[timing]") {
  EventLog log(kCpuDevice);
  REQUIRE_THROWS_AS(log.end(), InvalidInputError);
  log.begin("open");
  REQUIRE(log.open() == 1);
  REQUIRE_THROWS_AS(log.resolve(), InvalidInputError);
  log.end();
  auto got = log.resolve();
  REQUIRE(got.size() == 1);
  REQUIRE(got[0].label == "open");
  REQUIRE(log.resolve().empty());
}

TEST_CASE("timing: event logs move", "[timing]") {
  EventLog a(kCpuDevice);
  a.mark("x");
  a.mark("y");
  EventLog b(std::move(a));
  auto got = b.resolve();
  REQUIRE(got.size() == 1);
  REQUIRE(got[0].label == "y");
}

TEST_CASE("timing: calibration kernels exist exactly in builds with nvcc", "[timing]") {
#ifdef GPUKEEPER_HAVE_KERNELS
  REQUIRE(gpukeeper::calibration_kernels_available());
#else
  REQUIRE_FALSE(gpukeeper::calibration_kernels_available());
  REQUIRE_THROWS_AS(gpukeeper::launch_spin_kernel(1000, 0), DeviceError);
#endif
  if (gpukeeper::cuda_device_count() == 0) {
    REQUIRE_THROWS_AS(gpukeeper::calibrate(1000), gpukeeper::GpuError);
  }
}

// ---- on a GPU -------------------------------------------------------------------------

TEST_CASE("timing: a GPU timer measures spin kernels of 10 us, 100 us and 1 ms",
          "[timing][gpu][accuracy]") {
  GK_SKIP_UNLESS_GPU();
  GK_SKIP_UNLESS_KERNELS();
  for (std::uint64_t ns : {10'000ull, 100'000ull, 1'000'000ull}) {
    // Best of a few: a single reading may catch a preemption or a clock change.
    double best_err = 1e30;
    gpukeeper::Calibration best{};
    for (int rep = 0; rep < 5; ++rep) {
      gpukeeper::Calibration c = gpukeeper::calibrate(ns);
      double err = c.event_ms * 1e6 - static_cast<double>(c.kernel_ns);
      if (err < 0) err = -err;
      if (err < best_err) {
        best_err = err;
        best = c;
      }
    }
    INFO("requested " << ns << " ns, kernel " << best.kernel_ns << " ns, events "
                      << best.event_ms * 1e6 << " ns");
    // The kernel ran at least as long as asked (globaltimer ticks may be ~1 us coarse).
    CHECK(best.kernel_ns >= ns);
    CHECK(best.kernel_ns <= ns + ns / 10 + 5'000);
    // The event pair reads the kernel's time plus at most the launch gap on the stream
    // (a few us); never noticeably less.
    CHECK(best.event_ms * 1e6 >= static_cast<double>(best.kernel_ns) - 1'500.0);
    CHECK(best.event_ms * 1e6 <= static_cast<double>(best.kernel_ns) * 1.05 + 15'000.0);
  }
}

TEST_CASE("timing: GPU timers and logs reuse pooled events once warm", "[timing][gpu]") {
  GK_SKIP_UNLESS_GPU();
  EventPool& pool = EventPool::for_device(0);
  REQUIRE(&pool == &EventPool::for_device(0));
  auto round = [] {
    for (int i = 0; i < 20; ++i) {
      Timer t(0);
      REQUIRE(t.is_gpu());
      const auto host0 = std::chrono::steady_clock::now();
      t.start();
      t.stop();
      const double ms = t.elapsed_ms();  // waits for the stop event
      // The device passed both events within this host interval.
      REQUIRE(ms >= 0.0);
      REQUIRE(ms <= ms_since(host0));
    }
    EventLog log(0);
    log.mark("origin");
    for (int i = 0; i < 50; ++i) log.mark("step");
    auto got = log.resolve();
    REQUIRE(got.size() == 50);
    log.clear();
  };
  round();  // warm
  std::size_t created = pool.created();
  std::size_t idle = pool.idle();
  REQUIRE(idle >= 51);
  for (int i = 0; i < 5; ++i) round();
  REQUIRE(pool.created() == created);
  REQUIRE(pool.idle() == idle);

  pool.reserve(idle + 10);
  REQUIRE(pool.idle() == idle + 10);
  REQUIRE(pool.created() == created + 10);
}

TEST_CASE("timing: a GPU event log resolves spin kernels in order",
          "[timing][gpu][accuracy]") {
  GK_SKIP_UNLESS_GPU();
  GK_SKIP_UNLESS_KERNELS();
  EventLog log(0);
  gpukeeper::launch_spin_kernel(0, 0);  // warm-up
  log.mark("origin");
  gpukeeper::launch_spin_kernel(200'000, 0);
  log.mark("200us");
  log.begin("50us");
  gpukeeper::launch_spin_kernel(50'000, 0);
  log.end();
  gpukeeper::launch_spin_kernel(500'000, 0);
  log.mark("lap");
  auto got = log.resolve();
  REQUIRE(got.size() == 3);
  CHECK(got[0].label == "200us");
  CHECK(got[0].gpu_ms >= 0.199);
  CHECK(got[0].gpu_ms <= 0.3);
  CHECK(got[1].label == "50us");
  CHECK(got[1].gpu_ms >= 0.049);
  CHECK(got[1].gpu_ms <= 0.1);
  CHECK(got[2].label == "lap");
  CHECK(got[2].gpu_ms >= 0.549);
  CHECK(got[2].gpu_ms >= got[1].gpu_ms + 0.499);  // the lap holds "50us" and the 500 us
  CHECK(got[2].gpu_ms <= 0.8);
}

TEST_CASE("timing: a GPU timer's start/stop do not wait for the stream",
          "[timing][gpu][accuracy]") {
  GK_SKIP_UNLESS_GPU();
  GK_SKIP_UNLESS_KERNELS();
  gpukeeper::launch_spin_kernel(0, 0);
  Timer t(0);
  auto host0 = std::chrono::steady_clock::now();
  t.start();
  gpukeeper::launch_spin_kernel(50'000'000, 0);  // 50 ms
  t.stop();
  const double host_ms = ms_since(host0);
  CHECK(host_ms < 25.0);
  CHECK_FALSE(t.ready());
  const double ms = t.elapsed_ms();
  CHECK(ms >= 49.0);
  CHECK(ms <= 56.0);  // 50 ms of spinning plus launch gaps of microseconds
  CHECK(t.ready());
}
