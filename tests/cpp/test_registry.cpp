// PoolRegistry: one pool per device, made on first use.
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#ifdef GPUKEEPER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gpukeeper/memory/managed_buffer.hpp"
#include "gpukeeper/memory/pool_registry.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::ManagedBuffer;
using gpukeeper::PoolRegistry;

TEST_CASE("registry: one pool per device, made on first use", "[registry]") {
  const ResourceKind kind =
      GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::async, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  PoolOptions options;
  options.small_segment = 4 * MiB;
  PoolRegistry registry(kind, options);
  REQUIRE(registry.kind() == kind);
  REQUIRE(registry.device_count() >= 1);
  if (kind == ResourceKind::host) REQUIRE(registry.device_count() == 1);
  REQUIRE(registry.find(0) == nullptr);
  REQUIRE(registry.pools().empty());

  auto pool = registry.pool(0);
  REQUIRE(pool != nullptr);
  REQUIRE(pool->kind() == kind);
  REQUIRE(pool->device() == 0);
  REQUIRE(pool->options().small_segment == 4 * MiB);  // the registry's options
  REQUIRE(registry.pool(0) == pool);
  REQUIRE(registry.find(0) == pool);
  REQUIRE(registry.pools().size() == 1);

  // Every device the kind has gets its own pool.
  for (int d = 1; d < registry.device_count(); ++d) {
    auto other = registry.pool(d);
    REQUIRE(other != pool);
    REQUIRE(other->device() == d);
  }
  REQUIRE(registry.pools().size() == static_cast<std::size_t>(registry.device_count()));
}

TEST_CASE("registry: total usage and cleanup over all pools", "[registry]") {
  PoolRegistry registry(ResourceKind::host);
  REQUIRE(registry.total_usage() == std::make_pair(std::size_t{0}, std::size_t{0}));
  REQUIRE(registry.emergency_cleanup_all() == 0);
  auto pool = registry.pool(0);
  {
    ManagedBuffer a(pool, 3 * MiB);
    ManagedBuffer b(pool, 1000);
    auto usage = registry.total_usage();
    REQUIRE(usage.first == 3 * MiB + 1024);
    REQUIRE(usage.second == 3 * MiB + 1024);
    REQUIRE(registry.emergency_cleanup_all() == 0);  // both segments hold live blocks
  }
  auto usage = registry.total_usage();
  REQUIRE(usage.first == 0);
  REQUIRE(usage.second == 3 * MiB + 1024);  // the peak stays
  REQUIRE(pool->stats().reserved_bytes == 20 * MiB + 2 * MiB);
  REQUIRE(registry.emergency_cleanup_all() == 22 * MiB);
  REQUIRE(pool->stats().reserved_bytes == 0);
  REQUIRE(pool->validate() == "");
}

TEST_CASE("registry: pools outlive the registry while in use", "[registry]") {
  std::shared_ptr<CachingPool> pool;
  ManagedBuffer buf;
  {
    PoolRegistry registry(ResourceKind::host);
    pool = registry.pool(0);
    buf = ManagedBuffer(registry.pool(0), 4096);
  }
  REQUIRE(pool->owns(buf.data()));
  buf.reset();
  REQUIRE(pool->stats().allocated_count == 0);
}

TEST_CASE("registry: threads asking for a pool at once get the same one", "[registry]") {
  for (int attempt = 0; attempt < 20; ++attempt) {
    PoolRegistry registry(ResourceKind::host);
    std::vector<std::shared_ptr<CachingPool>> got(8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        got[t] = registry.pool(0);
        void* p = got[t]->allocate(256);
        got[t]->deallocate(p);
      });
    }
    for (auto& th : threads) th.join();
    std::set<CachingPool*> distinct;
    for (auto& p : got) distinct.insert(p.get());
    REQUIRE(distinct.size() == 1);
    REQUIRE(registry.pools().size() == 1);
    REQUIRE(got[0]->validate() == "");
  }
}

TEST_CASE("registry: streams that are not capturing get the device's pool", "[registry][graph_pools]") {
  const ResourceKind kind = GENERATE(ResourceKind::host, ResourceKind::device, ResourceKind::pinned);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  PoolRegistry registry(kind);
  REQUIRE(registry.pool_for(0, 0) == registry.pool(0));
  if (kind == ResourceKind::device) {
#ifdef GPUKEEPER_WITH_CUDA
    // Device memory asks CUDA about the stream, so it must be a real one.
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
    REQUIRE(registry.pool_for(0, reinterpret_cast<gpukeeper::stream_t>(s)) == registry.pool(0));
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
#endif
  } else {
    REQUIRE(registry.pool_for(0, 12345) == registry.pool(0));  // host kinds never ask CUDA
  }
  REQUIRE(registry.capture_pools(0).empty());
  REQUIRE(registry.drop_retired_captures(0) == 0);
  REQUIRE_THROWS_AS(registry.pool_for(99, 0), gpukeeper::InvalidInputError);
}

#ifdef GPUKEEPER_WITH_CUDA
// A capture nobody announced (as CuPy's Stream.begin_capture): its allocations come from
// its own pool, which outlives the capture while the graph lives, and goes at the first
// cleanup after CUDA destroys the graph.
TEST_CASE("registry: a raw stream capture allocates from its own pool until the graph is gone",
          "[registry][graph_pools]") {
  const ResourceKind kind = GENERATE(ResourceKind::device, ResourceKind::async);
  INFO("memory kind: " << gpukeeper::to_string(kind));
  GK_SKIP_UNLESS_USABLE(kind);
  PoolRegistry registry(kind);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const auto stream = reinterpret_cast<gpukeeper::stream_t>(s);
  void* eager = registry.pool(0)->allocate(MiB, stream);
  registry.pool(0)->deallocate(eager);  // a cached block the capture must not take

  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  auto captured = registry.pool_for(0, stream);
  REQUIRE(captured != registry.pool(0));
  REQUIRE(registry.pool_for(0, stream) == captured);  // the same capture, the same pool
  void* temp = nullptr;
  {
    ManagedBuffer t(captured, MiB, stream);
    temp = t.data();
    REQUIRE(temp != eager);
    REQUIRE(cudaMemsetAsync(temp, 1, MiB, s) == cudaSuccess);
  }  // freed inside the capture: the capture may reuse it, nothing else
  ManagedBuffer out(registry.pool_for(0, stream), MiB, stream);
  REQUIRE(out.data() == temp);
  REQUIRE(cudaMemsetAsync(out.data(), 2, MiB, s) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  REQUIRE(registry.pool_for(0, stream) == registry.pool(0));  // capture over: the main pool
  auto pools = registry.capture_pools(0);
  REQUIRE(pools.size() == 1);
  REQUIRE(pools[0].uses == 1);
  out.reset();
  REQUIRE(registry.drop_retired_captures(0) == 0);  // the graph lives: its memory stays
  REQUIRE(registry.capture_pools(0).size() == 1);

  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  // CUDA runs the destructor hook on a thread of its own, soon after.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!registry.capture_pools(0).empty() && registry.capture_pools(0)[0].uses > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(registry.capture_pools(0)[0].uses == 0);
  REQUIRE(registry.emergency_cleanup_all() >= MiB);
  REQUIRE(registry.capture_pools(0).empty());
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}
#endif
