// Stream awareness: a block freed on stream A is reused on A at once, and on stream B only
// once A's queued work is done. On the GPU, stream A is kept busy by a host function
// (cudaLaunchHostFunc) that waits for the test to open a gate, so "A is busy" is exact.
// Host memory is not stream-ordered: there any stream may reuse a block at once.
#include <atomic>
#include <chrono>
#include <thread>

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "test_support.hpp"

using namespace gktest;

TEST_CASE("streams: host memory is reused across stream ids at once", "[streams]") {
  auto pool = make_pool(ResourceKind::host);
  REQUIRE_FALSE(pool->upstream().stream_ordered());
  void* p = pool->allocate(12 * MiB, /*stream=*/1);
  pool->deallocate(p);
  void* q = pool->allocate(12 * MiB, /*stream=*/2);
  REQUIRE(q == p);
  pool->deallocate(q, /*stream=*/3);  // handed to stream 3
  void* r = pool->allocate(12 * MiB, /*stream=*/3);
  REQUIRE(r == p);
  pool->deallocate(r);
  REQUIRE(pool->stats().upstream_allocations == 1);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("streams: free blocks of different streams are merged by cleanup", "[streams]") {
  // Neighbours freed on different streams stay apart until the pool knows both streams
  // are done; emergency_cleanup waits for them and returns the whole segment.
  auto pool = make_pool(ResourceKind::host);
  void* a = pool->allocate(4 * KiB, 1);
  void* b = pool->allocate(4 * KiB, 1);
  pool->deallocate(a, 2);
  pool->deallocate(b, 3);
  REQUIRE(pool->validate() == "");
  REQUIRE(pool->emergency_cleanup() == 2 * MiB);
  REQUIRE(pool->stats().reserved_bytes == 0);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("streams: the tail of a block taken from another stream merges with its neighbours",
          "[streams]") {
  // Segment: [x 8K, free on 1][n 4K, free on 2][guard 4K, live][tail, free on 1]
  auto pool = make_pool(ResourceKind::host);
  void* x = pool->allocate(8 * KiB, 1);
  void* n = pool->allocate(4 * KiB, 1);
  void* guard = pool->allocate(4 * KiB, 1);
  REQUIRE(addr(n) == addr(x) + 8 * KiB);
  pool->deallocate(x, 1);
  pool->deallocate(n, 2);
  REQUIRE(pool->validate() == "");
  // Stream 2 has only n (too small); stream 1's x fits, and host memory is never busy:
  // x goes to stream 2 and is split. Its 2 KiB tail, now stream 2's, lies right before n,
  // which is stream 2's too: the two must be one free block.
  void* y = pool->allocate(6 * KiB, 2);
  REQUIRE(y == x);
  REQUIRE(pool->validate() == "");
  // A 6 KiB request on stream 2 needs no new memory (the merged 6 KiB behind y fits).
  void* z = pool->allocate(6 * KiB, 2);
  REQUIRE(pool->stats().upstream_allocations == 1);
  REQUIRE(pool->validate() == "");
  for (void* p : {y, z, guard}) pool->deallocate(p, 2);
  REQUIRE(pool->validate() == "");
  REQUIRE(pool->stats().upstream_allocations == 1);
}

#ifdef GPUKEEPER_WITH_CUDA

namespace {

// Keeps a stream busy until open() (or a safety timeout): everything queued after
// block() on that stream waits for it. Declare it after the pool, so that it opens, and
// its host function has finished, before the pool's destructor waits for the streams.
class Gate {
 public:
  ~Gate() {
    open();
    while (launched_ && !finished_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void block(cudaStream_t stream) {
    REQUIRE(cudaLaunchHostFunc(stream, &Gate::wait, this) == cudaSuccess);
    launched_ = true;
  }
  void open() { open_.store(true); }

 private:
  static void CUDART_CB wait(void* self) {
    auto* gate = static_cast<Gate*>(self);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!gate->open_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gate->finished_.store(true);
  }
  std::atomic<bool> open_{false};
  std::atomic<bool> finished_{false};
  bool launched_ = false;
};

struct TwoStreams {
  cudaStream_t a = nullptr, b = nullptr;
  TwoStreams() {
    REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~TwoStreams() {
    (void)cudaStreamSynchronize(a);
    (void)cudaStreamSynchronize(b);
    (void)cudaStreamDestroy(a);
    (void)cudaStreamDestroy(b);
  }
  stream_t id_a() const { return reinterpret_cast<stream_t>(a); }
  stream_t id_b() const { return reinterpret_cast<stream_t>(b); }
};

}  // namespace

#define GK_FOR_EACH_STREAM_ORDERED_KIND()                                                   \
  GK_SKIP_UNLESS_CUDA();                                                                    \
  const ResourceKind kind = GENERATE(ResourceKind::device, ResourceKind::async, ResourceKind::pinned); \
  INFO("memory kind: " << gpukeeper::to_string(kind));                                     \
  GK_SKIP_UNLESS_USABLE(kind)

TEST_CASE("streams: a block freed on A is reused on A at once, on B only after A's work",
          "[streams][gpu]") {
  GK_FOR_EACH_STREAM_ORDERED_KIND();
  // Fixed segments, and the default (hybrid over device memory: the pages under A's
  // freed block must not move to B's while A's work is pending either).
  const bool fixed = GENERATE(true, false);
  INFO("fixed segments: " << fixed);
  TwoStreams s;
  {
    auto pool = make_pool(kind, fixed ? fixed_segments() : PoolOptions{});
    Gate gate;
    REQUIRE(pool->upstream().stream_ordered());
    // 12 MiB is a whole segment, or whole pages: no tail block is left on either stream.
    void* p = pool->allocate(12 * MiB, s.id_a());
    gate.block(s.a);  // A is busy from here on
    pool->deallocate(p);

    void* again = pool->allocate(12 * MiB, s.id_a());
    REQUIRE(again == p);  // same stream: at once, though A is busy
    pool->deallocate(again);

    const PoolStats before = pool->stats();
    void* q = pool->allocate(12 * MiB, s.id_b());
    REQUIRE(cudaStreamQuery(s.a) == cudaErrorNotReady);  // A was busy all along
    REQUIRE(q != p);  // B must not take A's block while A's work is pending
    PoolStats after = pool->stats();
    if (fixed) {
      REQUIRE(after.upstream_allocations == before.upstream_allocations + 1);
    } else {
      REQUIRE(after.upstream_allocations > before.upstream_allocations);  // new pages
      REQUIRE(after.pages_moved == before.pages_moved);
    }
    REQUIRE(after.reserved_bytes == before.reserved_bytes + 12 * MiB);

    gate.open();
    REQUIRE(cudaStreamSynchronize(s.a) == cudaSuccess);
    void* r = pool->allocate(12 * MiB, s.id_b());  // A is done: its block serves B
    REQUIRE(r == p);
    REQUIRE(pool->stats().upstream_allocations == after.upstream_allocations);

    pool->deallocate(q);
    pool->deallocate(r);
    REQUIRE(pool->validate() == "");
    REQUIRE(pool->emergency_cleanup() == 24 * MiB);
    REQUIRE(pool->stats().reserved_bytes == 0);
  }
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("streams: a busy stream's free blocks are adopted only once its work is done",
          "[streams][gpu]") {
  GK_FOR_EACH_STREAM_ORDERED_KIND();
  TwoStreams s;
  {
    auto pool = make_pool(kind, fixed_segments());
    Gate gate;
    // One 20 MiB segment: [a 4M on A][b 4M on B][tail 12M on B].
    void* a = pool->allocate(4 * MiB, s.id_a());
    void* b = pool->allocate(4 * MiB, s.id_b());
    REQUIRE(addr(b) == addr(a) + 4 * MiB);
    gate.block(s.b);  // B is busy from here on
    pool->deallocate(a);
    pool->deallocate(b);
    const PoolStats before = pool->stats();
    void* c = pool->allocate(18 * MiB, s.id_a());  // B's blocks are not A's to merge yet
    REQUIRE(cudaStreamQuery(s.b) == cudaErrorNotReady);
    CHECK(c != a);
    CHECK(pool->stats().upstream_allocations == before.upstream_allocations + 1);
    gate.open();
    REQUIRE(cudaStreamSynchronize(s.b) == cudaSuccess);
    void* d = pool->allocate(18 * MiB, s.id_a());  // B is idle: adopted and merged
    CHECK(d == a);
    CHECK(pool->stats().upstream_allocations == before.upstream_allocations + 1);
    pool->deallocate(c);
    pool->deallocate(d);
    REQUIRE(pool->validate() == "");
  }
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("streams: deallocate(ptr, stream) hands the block to that stream", "[streams][gpu]") {
  GK_FOR_EACH_STREAM_ORDERED_KIND();
  TwoStreams s;
  auto pool = make_pool(kind);
  Gate gate;
  void* p = pool->allocate(12 * MiB, s.id_a());
  gate.block(s.a);
  // The block's last user is B (B is idle): B reuses it at once, A's work notwithstanding.
  pool->deallocate(p, s.id_b());
  void* q = pool->allocate(12 * MiB, s.id_b());
  REQUIRE(q == p);
  pool->deallocate(q, s.id_b());
  // B has no pending work, so A may take it too.
  void* r = pool->allocate(12 * MiB, s.id_a());
  REQUIRE(r == p);
  gate.open();
  pool->deallocate(r);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("streams: emergency_cleanup waits for the streams that used the memory",
          "[streams][gpu]") {
  GK_FOR_EACH_STREAM_ORDERED_KIND();
  TwoStreams s;
  auto pool = make_pool(kind);
  Gate gate;
  void* p = pool->allocate(12 * MiB, s.id_a());
  gate.block(s.a);
  pool->deallocate(p);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gate.open();
  });
  auto start = std::chrono::steady_clock::now();
  std::size_t released = pool->emergency_cleanup();
  auto waited = std::chrono::steady_clock::now() - start;
  opener.join();
  REQUIRE(released == 12 * MiB);
  REQUIRE(pool->stats().reserved_bytes == 0);
  REQUIRE(cudaStreamQuery(s.a) == cudaSuccess);  // it returned only after A's work
  REQUIRE(waited >= std::chrono::milliseconds(150));
}

TEST_CASE("streams: cleanup and destruction never touch a stream its owner destroyed",
          "[streams][gpu]") {
  // A CuPy stream collected before its pool was emptied crashed the process: the pool
  // recorded an event on the dead handle. Release paths wait for the device instead.
  GK_FOR_EACH_STREAM_ORDERED_KIND();
  // Through a counting upstream, to see that the destructor gave everything back.
  auto upstream = std::make_unique<TestUpstream>(0, gpukeeper::make_resource(kind, 0));
  std::shared_ptr<UpstreamLog> log = upstream->log();
  auto pool = std::make_shared<CachingPool>(std::move(upstream));
  (void)cudaGetLastError();  // checked at the end: only this test's calls count
  for (int round = 0; round < 20; ++round) {
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void* p = pool->allocate(12 * MiB, reinterpret_cast<gpukeeper::stream_t>(s));
    pool->deallocate(p);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
    // Other streams take the dead one's place in the driver's memory.
    cudaStream_t churn[8];
    for (auto& c : churn) REQUIRE(cudaStreamCreate(&c) == cudaSuccess);
    for (auto& c : churn) REQUIRE(cudaStreamDestroy(c) == cudaSuccess);
    REQUIRE(pool->emergency_cleanup() == 12 * MiB);
    REQUIRE(pool->stats().reserved_bytes == 0);
  }
  void* kept = nullptr;
  {
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    kept = pool->allocate(1 * MiB, reinterpret_cast<gpukeeper::stream_t>(s));
    pool->deallocate(kept);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  }
  pool.reset();  // the destructor waits for the device, not for the dead stream
  // No call failed on the dead stream (it would be the runtime's last error now), the
  // device is healthy, and every segment went back.
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(log->used_now() == 0);
  REQUIRE(log->deallocations == log->allocations);
  REQUIRE(log->allocations == 21);  // a 12 MiB segment per round, and a small one
}

TEST_CASE("streams: a small block's segment tail stays with its stream", "[streams][gpu]") {
  GK_FOR_EACH_STREAM_ORDERED_KIND();
  TwoStreams s;
  auto pool = make_pool(kind);
  Gate gate;
  void* p = pool->allocate(4 * KiB, s.id_a());  // 2 MiB segment; the tail is A's
  gate.block(s.a);
  void* q = pool->allocate(4 * KiB, s.id_b());  // not from A's tail while A is busy
  REQUIRE_FALSE((addr(q) >= addr(p) && addr(q) < addr(p) + 2 * MiB));
  void* p2 = pool->allocate(4 * KiB, s.id_a());  // A's tail, at once
  REQUIRE(addr(p2) == addr(p) + 4 * KiB);
  gate.open();
  REQUIRE(cudaStreamSynchronize(s.a) == cudaSuccess);
  for (void* x : {p, q, p2}) pool->deallocate(x);
  REQUIRE(pool->validate() == "");
  REQUIRE(pool->emergency_cleanup() == 4 * MiB);
}

#else

TEST_CASE("streams: CUDA stream tests need a CUDA build", "[streams][gpu]") {
  GK_SKIP("gpukeeper was built without CUDA");
}

#endif
