// The registry of pool layouts (pool_layout.hpp): which segment layout a pool takes
// (PoolOptions{}, SegmentLayout::automatic, is hybrid over device memory with virtual
// memory and fixed everywhere else, and options() says what was chosen), each layout's
// type, and the one mapping between the words Python users type and the C++ names. Each
// layout's own test is beside its type (test_fixed_layout.cpp, ...).
#include <memory>
#include <string>

#include "gpukeeper/memory/cuda_virtual_memory.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::DeviceError;
using gpukeeper::SegmentSnapshot;
using gpukeeper::VirtualMemory;

namespace {

// Host memory that calls itself device memory, with host virtual memory, none, or a
// device that refuses it (as cuda_virtual_memory.cpp does without the support).
enum class Pages { host, none, refused };

class DeviceLike final : public MemoryResource {
 public:
  explicit DeviceLike(Pages pages) : pages_(pages) {}
  void* allocate(std::size_t bytes, stream_t stream) override { return host_.allocate(bytes, stream); }
  void deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override {
    host_.deallocate(ptr, bytes, stream);
  }
  ResourceKind kind() const noexcept override { return ResourceKind::device; }
  int device() const noexcept override { return 0; }
  bool stream_ordered() const noexcept override { return false; }
  bool device_accessible() const noexcept override { return true; }
  bool host_accessible() const noexcept override { return true; }
  MemoryInfo memory_info() const override { return host_.memory_info(); }
  VirtualMemory* virtual_memory() override {
    if (pages_ == Pages::refused) {
      throw DeviceError("make_cuda_virtual_memory", 0, "unsupported",
                        "device 0 does not support virtual memory management");
    }
    return pages_ == Pages::host ? host_.virtual_memory() : nullptr;
  }

 private:
  Pages pages_;
  gpukeeper::HostResource host_;
};

PoolOptions with_layout(SegmentLayout layout) {
  PoolOptions options;
  options.segments = layout;
  options.expandable_range = 256 * MiB;
  return options;
}

// Whether the pool put a 5 MiB block in an expandable range.
bool large_block_expandable(CachingPool& pool) {
  void* p = pool.allocate(5 * MiB);
  bool expandable = false;
  for (const SegmentSnapshot& seg : pool.snapshot()) {
    for (const auto& b : seg.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(p)) expandable = seg.expandable;
    }
  }
  pool.deallocate(p);
  return expandable;
}

}  // namespace

TEST_CASE("layout: the default is hybrid over device memory with virtual memory",
          "[caching_pool]") {
  CachingPool pool(std::make_unique<DeviceLike>(Pages::host), with_layout(SegmentLayout::automatic));
  CHECK(pool.options().segments == SegmentLayout::hybrid);
  CHECK(large_block_expandable(pool));
  void* small = pool.allocate(4096);  // small requests stay in fixed segments
  for (const SegmentSnapshot& seg : pool.snapshot()) {
    if (seg.small) CHECK_FALSE(seg.expandable);
  }
  pool.deallocate(small);
  CHECK(pool.validate() == "");
  CHECK(PoolOptions{}.segments == SegmentLayout::automatic);
}

TEST_CASE("layout: the default is fixed without virtual memory, and for host memory",
          "[caching_pool]") {
  SECTION("a device without the support") {
    CachingPool pool(std::make_unique<DeviceLike>(Pages::refused), PoolOptions{});
    CHECK(pool.options().segments == SegmentLayout::fixed);
    CHECK_FALSE(large_block_expandable(pool));
  }
  SECTION("an upstream with no virtual memory") {
    CachingPool pool(std::make_unique<DeviceLike>(Pages::none), PoolOptions{});
    CHECK(pool.options().segments == SegmentLayout::fixed);
    CHECK_FALSE(large_block_expandable(pool));
  }
  SECTION("host memory, which has virtual memory but little to gain") {
    auto pool = make_pool(ResourceKind::host);
    CHECK(pool->options().segments == SegmentLayout::fixed);
    CHECK_FALSE(large_block_expandable(*pool));
  }
}

TEST_CASE("layout: asked for explicitly, expandable segments need the support",
          "[caching_pool]") {
  CHECK_THROWS_AS(CachingPool(std::make_unique<DeviceLike>(Pages::refused),
                              with_layout(SegmentLayout::hybrid)),
                  DeviceError);
  CHECK_THROWS_AS(CachingPool(std::make_unique<DeviceLike>(Pages::none),
                              with_layout(SegmentLayout::expandable)),
                  gpukeeper::InvalidInputError);
  CachingPool fixed(std::make_unique<DeviceLike>(Pages::host), with_layout(SegmentLayout::fixed));
  CHECK(fixed.options().segments == SegmentLayout::fixed);
  CHECK_FALSE(large_block_expandable(fixed));
}

TEST_CASE("layout: every layout has its type, its name and the word users type for it",
          "[caching_pool]") {
  using gpukeeper::make_layout;
  using gpukeeper::layout_needs_virtual_memory;
  using gpukeeper::python_spelling;
  struct Row {
    SegmentLayout layout;
    const char* name;
    const char* python;
    bool needs_pages;
  };
  const Row rows[] = {{SegmentLayout::automatic, "auto", "'auto'", false},
                      {SegmentLayout::fixed, "fixed", "False", false},
                      {SegmentLayout::expandable, "expandable", "True", true},
                      {SegmentLayout::hybrid, "hybrid", "'hybrid'", true}};
  for (const Row& row : rows) {
    CAPTURE(row.name);
    CHECK(std::string(gpukeeper::to_string(row.layout)) == row.name);
    CHECK(std::string(python_spelling(row.layout)) == row.python);
    SegmentLayout parsed = SegmentLayout::automatic;
    bool former = true;
    CHECK(gpukeeper::layout_from_python(row.python, parsed, &former));
    CHECK(parsed == row.layout);
    CHECK_FALSE(former);
    // The same word in Python as in C++: each layout's word, quoted, names it too.
    parsed = SegmentLayout::automatic;
    CHECK(gpukeeper::layout_from_python(std::string("'") + row.name + "'", parsed));
    CHECK(parsed == row.layout);
    CHECK(layout_needs_virtual_memory(row.layout) == row.needs_pages);
    if (row.layout == SegmentLayout::automatic) {
      CHECK_THROWS_AS(make_layout(row.layout), gpukeeper::InvalidInputError);
    } else {
      CHECK(make_layout(row.layout)->id() == row.layout);
    }
  }
  // The former word for hybrid is still read, and said to be former.
  SegmentLayout parsed = SegmentLayout::fixed;
  bool former = false;
  CHECK(gpukeeper::layout_from_python("'large'", parsed, &former));
  CHECK((parsed == SegmentLayout::hybrid && former));
  SegmentLayout untouched = SegmentLayout::fixed;
  for (const char* other : {"'automatic'", "'True'", "auto", "hybrid", "'Fixed'", ""}) {
    CAPTURE(other);
    CHECK_FALSE(gpukeeper::layout_from_python(other, untouched));
  }
  CHECK(untouched == SegmentLayout::fixed);
  // Every spelling, in the registry's order (a new layout's row adds its own at the end).
  const std::string listed = gpukeeper::python_spellings();
  CHECK(listed.rfind("'auto', True, False", 0) == 0);
  CHECK(listed.find("'hybrid'") != std::string::npos);
  CHECK(listed.find("'large'") == std::string::npos);
  CHECK(listed.find(" or ") != std::string::npos);
}

TEST_CASE("layout: automatic is settled by the upstream, the others are what was asked",
          "[caching_pool]") {
  using gpukeeper::resolve_layout;
  DeviceLike with_pages(Pages::host), without(Pages::none), refused(Pages::refused);
  CHECK(resolve_layout(SegmentLayout::automatic, with_pages) == SegmentLayout::hybrid);
  CHECK(resolve_layout(SegmentLayout::automatic, without) == SegmentLayout::fixed);
  CHECK(resolve_layout(SegmentLayout::automatic, refused) == SegmentLayout::fixed);
  gpukeeper::HostResource host;
  CHECK(resolve_layout(SegmentLayout::automatic, host) == SegmentLayout::fixed);
  for (SegmentLayout asked :
       {SegmentLayout::fixed, SegmentLayout::expandable, SegmentLayout::hybrid}) {
    CHECK(resolve_layout(asked, refused) == asked);  // the pool then raises the device's error
  }
}

TEST_CASE("layout: a CUDA device pool is hybrid by default where the device supports it",
          "[caching_pool]") {
  GK_SKIP_UNLESS_USABLE(ResourceKind::device);
  auto pool = make_pool(ResourceKind::device);
  const bool supported = gpukeeper::cuda_virtual_memory_supported(0);
  CHECK(pool->options().segments == (supported ? SegmentLayout::hybrid : SegmentLayout::fixed));
  CHECK(large_block_expandable(*pool) == supported);
  CHECK(pool->validate() == "");
}
