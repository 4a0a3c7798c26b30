// StreamGate and Timer(hide_launch_latency): refused cleanly where there is no GPU or no
// gate kernel; on a GPU, a gate holds its stream (and the floor kernel queued behind
// it) until opened or timed out, slots are
// reused and their idle chunks freed, nesting works, graph capture is refused, and a
// hidden-latency timer reads the calibration kernels within 0.5 us of their own
// %globaltimer duration.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/device/runtime.hpp"
#include "gpukeeper/kernels/calibration.hpp"
#include "gpukeeper/timing/launch_floor.hpp"
#include "gpukeeper/timing/stream_gate.hpp"
#include "gpukeeper/timing/timer.hpp"
#include "gpukeeper/timing/timer_calibration.hpp"

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

using gpukeeper::GateOutcome;
using gpukeeper::InvalidInputError;
using gpukeeper::kCpuDevice;
using gpukeeper::StreamGate;
using gpukeeper::Timer;

namespace {

#ifdef GPUKEEPER_WITH_CUDA
// Why gates cannot be closed here ("" when they can).
std::string why_no_gates() {
  if (gpukeeper::stream_gates_available()) return "";
  if (gpukeeper::cuda_device_count() == 0) return gpukeeper::cuda_status().reason;
  return "gpukeeper was built without CUDA (no gate kernel)";
}

void sync_stream(gpukeeper::stream_t s) {
  REQUIRE(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)) == cudaSuccess);
}
bool stream_idle(gpukeeper::stream_t s) {
  cudaError_t status = cudaStreamQuery(reinterpret_cast<cudaStream_t>(s));
  if (status == cudaErrorNotReady) (void)cudaGetLastError();
  return status == cudaSuccess;
}
#endif

}  // namespace

TEST_CASE("gate: refused without a GPU or kernels; empty gates are harmless", "[gate]") {
  StreamGate empty;
  REQUIRE_FALSE(empty.holds_slot());
  REQUIRE(empty.is_open());
  empty.open();
  REQUIRE(empty.outcome() == GateOutcome::pending);
  empty.reset();
  REQUIRE_THROWS_AS(empty.queue_floor_kernel(), InvalidInputError);  // nothing to sit behind

  REQUIRE_THROWS_AS(StreamGate(0, 0, 0), InvalidInputError);
  REQUIRE_THROWS_AS(Timer(kCpuDevice, 0, true, 0), InvalidInputError);
  // In CPU mode a hidden-latency timer is a plain steady-clock timer.
  Timer cpu(kCpuDevice, 0, true);
  REQUIRE_FALSE(cpu.is_gpu());
  REQUIRE_FALSE(cpu.hides_launch_latency());
  cpu.start();
  cpu.stop();
  REQUIRE_FALSE(cpu.launch_hidden());
  if (!gpukeeper::stream_gates_available()) {
    REQUIRE_THROWS_AS(StreamGate(0, 0), gpukeeper::GpuError);
    REQUIRE_THROWS_AS(gpukeeper::launch_floor_ms(0), gpukeeper::GpuError);
    REQUIRE_THROWS_AS(gpukeeper::release_idle_gate_slots(0), gpukeeper::GpuError);
    if (gpukeeper::cuda_device_count() > 0) {
      REQUIRE_THROWS_AS(Timer(0, 0, true), gpukeeper::DeviceError);
    }
  }
  REQUIRE_THROWS_AS(StreamGate(-2, 0), gpukeeper::GpuError);
}

#ifdef GPUKEEPER_WITH_CUDA

// In a test case: skips it unless stream gates can be closed here.
#define GK_SKIP_UNLESS_GATES()                                        \
  do {                                                                \
    const std::string gk_why_ = why_no_gates();                       \
    if (!gk_why_.empty()) GK_SKIP("no stream gates: " << gk_why_);    \
  } while (0)

TEST_CASE("gate: a closed gate holds the stream until it is opened", "[gate][gpu]") {
  GK_SKIP_UNLESS_GATES();
  gpukeeper::launch_spin_kernel(0, 0);  // module loaded before anything is timed
  sync_stream(0);
  StreamGate gate(0, 0);
  REQUIRE(gate.holds_slot());
  REQUIRE_FALSE(gate.is_open());
  gpukeeper::launch_spin_kernel(1'000, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(stream_idle(0));
  CHECK(gate.outcome() == GateOutcome::pending);
  gate.open();
  gate.open();  // idempotent
  sync_stream(0);
  CHECK(gate.outcome() == GateOutcome::opened);
  CHECK(stream_idle(0));
}

TEST_CASE("gate: the floor kernel sits behind a closed gate, and is refused after open",
          "[gate][gpu]") {
  GK_SKIP_UNLESS_GATES();
  gpukeeper::launch_spin_kernel(0, 0);
  sync_stream(0);
  StreamGate gate(0, 0);
  gate.queue_floor_kernel();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(stream_idle(0));  // held with the gate
  gate.open();
  sync_stream(0);
  CHECK(gate.outcome() == GateOutcome::opened);
  REQUIRE_THROWS_AS(gate.queue_floor_kernel(), InvalidInputError);
}

TEST_CASE("gate: an unopened gate times out and lets the work through", "[gate][gpu]") {
  GK_SKIP_UNLESS_GATES();
  StreamGate gate(0, 0, 5'000'000);  // 5 ms
  gpukeeper::launch_spin_kernel(1'000, 0);
  auto t0 = std::chrono::steady_clock::now();
  sync_stream(0);  // would hang without the timeout
  double waited =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited < 1000.0);
  CHECK(gate.outcome() == GateOutcome::timed_out);
  gate.reset();
  REQUIRE_FALSE(gate.holds_slot());
}

TEST_CASE("gate: nested gates open in any order; slots are reused", "[gate][gpu]") {
  GK_SKIP_UNLESS_GATES();
  {
    StreamGate outer(0, 0);
    StreamGate inner(0, 0);
    gpukeeper::launch_spin_kernel(1'000, 0);
    inner.open();
    outer.open();
    sync_stream(0);
    CHECK(outer.outcome() == GateOutcome::opened);
    CHECK(inner.outcome() == GateOutcome::opened);
  }
  for (int i = 0; i < 10; ++i) {
    StreamGate g(0, 0);
    g.open();
  }
  sync_stream(0);
  std::size_t created = gpukeeper::gate_slot_stats(0).created;
  for (int round = 0; round < 5; ++round) {
    std::vector<StreamGate> gates;
    for (int i = 0; i < 40; ++i) gates.emplace_back(0, 0);
    gates.clear();  // opens each, hands the slots back while kernels may still be queued
    sync_stream(0);
  }
  auto stats = gpukeeper::gate_slot_stats(0);
  CHECK(stats.created == created);
  CHECK(stats.retiring == 0);
  CHECK(stats.idle == stats.created);
}

TEST_CASE("gate: idle slot chunks go back to the driver; chunks in use stay", "[gate][gpu]") {
  // What runs for every device at process exit, so that compute-sanitizer's leak check
  // (scripts/gpu-check.sh) finds no pinned gate memory.
  GK_SKIP_UNLESS_GATES();
  sync_stream(0);
  gpukeeper::release_idle_gate_slots(0);  // what earlier test cases left
  REQUIRE(gpukeeper::gate_slot_stats(0).created == 0);
  {
    StreamGate held(0, 0);
    const std::size_t chunk = gpukeeper::gate_slot_stats(0).created;
    REQUIRE(chunk > 0);
    // Held by a gate (open or not): its chunk stays, the gate may still write its slot.
    CHECK(gpukeeper::release_idle_gate_slots(0) == 0);
    held.open();
    sync_stream(0);
    CHECK(held.outcome() == GateOutcome::opened);
    CHECK(gpukeeper::release_idle_gate_slots(0) == 0);
    CHECK(gpukeeper::gate_slot_stats(0).created == chunk);
  }
  sync_stream(0);  // the slot's kernel is done: the whole chunk is idle
  const gpukeeper::GateSlotStats before = gpukeeper::gate_slot_stats(0);
  CHECK(gpukeeper::release_idle_gate_slots(0) == before.created);
  const gpukeeper::GateSlotStats after = gpukeeper::gate_slot_stats(0);
  CHECK(after.created == 0);
  CHECK(after.idle == 0);
  CHECK(after.retiring == 0);
  // Gates still work: a new chunk is made.
  StreamGate again(0, 0);
  again.open();
  sync_stream(0);
  CHECK(again.outcome() == GateOutcome::opened);
  CHECK(gpukeeper::gate_slot_stats(0).created > 0);
}

TEST_CASE("gate: a stream capturing a CUDA graph is refused", "[gate][gpu]") {
  GK_SKIP_UNLESS_GATES();
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  auto handle = reinterpret_cast<gpukeeper::stream_t>(s);
  CHECK_THROWS_AS(StreamGate(0, handle), InvalidInputError);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(s);
  auto stats = gpukeeper::gate_slot_stats(0);
  CHECK(stats.idle + stats.retiring == stats.created);  // the refused gate took no slot
}

TEST_CASE("gate: a hidden-latency timer less the launch floor reads 10 us, 100 us and 1 ms "
          "within 0.5 us",
          "[gate][gpu][accuracy]") {
  GK_SKIP_UNLESS_GATES();
  const double floor_ns = gpukeeper::launch_floor_ms(0) * 1e6;
  INFO("launch floor " << floor_ns << " ns");
  // The floor is the device's cost of the bracket: positive, and far below a launch.
  CHECK(floor_ns > 0.0);
  CHECK(floor_ns < 10'000.0);
  CHECK(gpukeeper::launch_floor_ms(0) * 1e6 == floor_ns);  // cached
  for (std::uint64_t ns : {10'000ull, 100'000ull, 1'000'000ull}) {
    // Median of 21: single readings can catch a preemption or a clock change.
    std::vector<double> errors;
    std::vector<double> open_errors;
    for (int rep = 0; rep < 21; ++rep) {
      gpukeeper::Calibration hidden = gpukeeper::calibrate(ns, 0, 0, true);
      REQUIRE(hidden.launch_hidden);
      errors.push_back(hidden.event_ms * 1e6 - floor_ns - static_cast<double>(hidden.kernel_ns));
      gpukeeper::Calibration plain = gpukeeper::calibrate(ns, 0, 0, false);
      REQUIRE_FALSE(plain.launch_hidden);
      open_errors.push_back(plain.event_ms * 1e6 - static_cast<double>(plain.kernel_ns));
    }
    std::sort(errors.begin(), errors.end());
    std::sort(open_errors.begin(), open_errors.end());
    double median = errors[errors.size() / 2];
    INFO("requested " << ns << " ns: hidden error (less the floor) median " << median
                      << " ns; plain "
                      << open_errors[open_errors.size() / 2] << " ns");
    CHECK(median <= 500.0);
    CHECK(median >= -500.0);
    // The gate never makes the reading worse than the plain event pair.
    CHECK(median + floor_ns <= open_errors[open_errors.size() / 2] + 200.0);
  }
}

TEST_CASE("gate: a hidden-latency timer reports a timed-out gate", "[gate][gpu][accuracy]") {
  GK_SKIP_UNLESS_GATES();
  Timer t(0, 0, true, 2'000'000);  // 2 ms
  REQUIRE(t.hides_launch_latency());
  t.start();
  gpukeeper::launch_spin_kernel(1'000, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  t.stop();
  CHECK_FALSE(t.launch_hidden());
  CHECK(t.gate_outcome() == GateOutcome::timed_out);
  // The interval ran from the timeout to the stop record: host time, not the kernel's.
  CHECK(t.elapsed_ms() > 5.0);
  t.start();
  gpukeeper::launch_spin_kernel(1'000, 0);
  t.stop();
  CHECK(t.launch_hidden());
  CHECK(t.elapsed_ms() < 1.0);
}

#else

TEST_CASE("gate: stream gates need a CUDA build", "[gate][gpu]") {
  GK_SKIP("gpukeeper was built without CUDA");
}

#endif  // GPUKEEPER_WITH_CUDA
