// PagedMemory (the physical side of expandable segments) driven directly, over a fake
// VirtualMemory that counts driver calls and refuses to map an address twice: a page that
// moves keeps its old address as a stale alias, and comes back to it with no call.
#include <map>
#include <vector>

#include "gpukeeper/memory/paged_memory.hpp"
#include "test_support.hpp"

using namespace gktest;
using gpukeeper::VirtualMemory;
using gpukeeper::detail::PagedMemory;
using gpukeeper::detail::PageTable;

namespace {

constexpr std::size_t kPage = 2 * MiB;

// Addresses are numbers (nothing is touched); every call is counted and checked.
class CountingVirtualMemory final : public VirtualMemory {
 public:
  explicit CountingVirtualMemory(std::size_t page = kPage) : page_(page) {}
  std::size_t page_size() const noexcept override { return page_; }
  std::uintptr_t reserve(std::size_t bytes) override {
    const std::uintptr_t base = next_;
    next_ += bytes + kPage;
    return base;
  }
  void unreserve(std::uintptr_t, std::size_t) noexcept override {}
  page_t create_page() override {
    ++live_pages;
    return ++last_;
  }
  void release_page(page_t) noexcept override { --live_pages; }
  void map(std::uintptr_t address, page_t page) override {
    REQUIRE(mapped.count(address) == 0);  // an address holds one mapping at a time
    mapped[address] = page;
    ++maps;
  }
  void set_access(std::uintptr_t, std::size_t) override { ++grants; }
  void unmap(std::uintptr_t address) noexcept override {
    if (mapped.erase(address) == 0) ++bad_unmaps;
    ++unmaps;
  }
  // A page's "descriptor" is its handle plus 1000, so that a test can tell which it is.
  int share_page(page_t page) override {
    ++shares;
    return static_cast<int>(page) + 1000;
  }

  std::map<std::uintptr_t, page_t> mapped;
  int shares = 0;
  int maps = 0, unmaps = 0, grants = 0, bad_unmaps = 0, live_pages = 0;

 private:
  std::size_t page_;
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
  page_t last_ = 0;
};

const PagedMemory::StreamsDone kDone = [](std::uint64_t) { return true; };
const std::function<bool()> kMayCreate = [] { return true; };

// One range of eight pages over the counting fake.
struct EightPages {
  CountingVirtualMemory vm;
  PagedMemory pm{vm, 64 * kPage};
  PageTable* t = nullptr;

  EightPages() {
    t = pm.reserve();
    REQUIRE(t != nullptr);
    pm.extend(t, 8 * kPage);
  }
  std::uintptr_t at(std::size_t slot) const { return t->base + slot * kPage; }
};

}  // namespace

TEST_CASE_METHOD(EightPages,
                 "paged memory: a moved page keeps its old address as an alias and comes back free",
                 "[caching_pool][paged_memory]") {
  auto books = [&](std::vector<std::uint32_t> refs) { return pm.check(t, refs); };

  // Pages 0 and 1 made; with no spare allowed, the next page beyond them is moved.
  REQUIRE(pm.acquire(t, at(0), 2 * kPage, kDone, kMayCreate, 0));
  pm.release(t, at(0), 2 * kPage, 0);
  REQUIRE(pm.acquire(t, at(4), kPage, kDone, kMayCreate, 0));
  CHECK(pm.pages_moved() == 1);
  CHECK(vm.maps == 3);
  CHECK(vm.unmaps == 0);  // the top page (1) left a stale alias behind
  CHECK(t->aliases == 1);
  CHECK(pm.mapped_bytes() == 2 * kPage);
  CHECK(books({0, 0, 0, 0, 1, 0, 0, 0}) == "");

  // The page is free again and the highest movable one: a block back at slot 1 gets it
  // with no driver call at all.
  pm.release(t, at(4), kPage, 0);
  REQUIRE(pm.acquire(t, at(1), kPage, kDone, kMayCreate, 0));
  CHECK(pm.pages_revived() == 1);
  CHECK(vm.maps == 3);
  CHECK(vm.unmaps == 0);
  CHECK(vm.grants == 2);
  CHECK(books({0, 1, 0, 0, 0, 0, 0, 0}) == "");

  // Slot 4 now holds a stale alias of a page in use at 1: a block there gets another page
  // (page 0, moved), and the alias is unmapped first.
  REQUIRE(pm.acquire(t, at(4), kPage, kDone, kMayCreate, 0));
  CHECK(vm.unmaps == 1);
  CHECK(vm.maps == 4);
  CHECK(pm.pages_moved() == 2);
  CHECK(books({0, 1, 0, 0, 1, 0, 0, 0}) == "");
  CHECK(vm.bad_unmaps == 0);

  // Cleanup unmaps every alias and every page and frees them all.
  pm.release(t, at(1), kPage, 0);
  pm.release(t, at(4), kPage, 0);
  CHECK(pm.unmap_movable(0) == 2 * kPage);
  CHECK(vm.mapped.empty());
  CHECK(vm.live_pages == 0);
  CHECK(t->mapped == 0);
  CHECK(t->aliases == 0);
  CHECK(vm.bad_unmaps == 0);
  CHECK(books({}) == "");
  pm.unreserve(t);
}

TEST_CASE_METHOD(EightPages,
                 "paged memory: a page with no room for another alias leaves no mapping behind",
                 "[caching_pool][paged_memory]") {

  // One page, moved up the range from slot to slot: 0 -> 2 -> 4 -> 6.
  REQUIRE(pm.acquire(t, at(0), kPage, kDone, kMayCreate, 0));
  for (std::size_t slot : {2u, 4u, 6u}) {
    pm.release(t, at(slot - 2), kPage, 0);
    REQUIRE(pm.acquire(t, at(slot), kPage, kDone, kMayCreate, 0));
  }
  CHECK(pm.pages_moved() == 3);
  CHECK(pm.mapped_bytes() == kPage);
  // Aliases at 0 and 2; the third move found no room and unmapped slot 4.
  CHECK(t->aliases == 2);
  CHECK(vm.unmaps == 1);
  CHECK(vm.mapped.size() == 3);
  CHECK(pm.check(t, {0, 0, 0, 0, 0, 0, 1, 0}) == "");
  pm.release(t, at(6), kPage, 0);
  CHECK(pm.unmap_movable(0) == kPage);
  CHECK(vm.mapped.empty());
  CHECK(vm.live_pages == 0);
  CHECK(vm.bad_unmaps == 0);
}

TEST_CASE("paged memory: a page size that is not a power of two is refused", "[caching_pool]") {
  // Page indices are shifts of addresses; a driver granularity is a power of two.
  CountingVirtualMemory odd(3 * MiB);
  CHECK_THROWS_AS(PagedMemory(odd, 64 * MiB), gpukeeper::InvalidInputError);
  CountingVirtualMemory none(0);
  CHECK_THROWS_AS(PagedMemory(none, 64 * MiB), gpukeeper::InvalidInputError);
}

TEST_CASE_METHOD(EightPages,
                 "paged memory: sharing a block gives its pages' descriptors in address order",
                 "[caching_pool][paged_memory]") {
  // A block from the middle of page 1 to the middle of page 3 lies on pages 1, 2 and 3.
  REQUIRE(pm.acquire(t, at(1) + kPage / 2, 2 * kPage, kDone, kMayCreate, 8 * kPage));
  std::vector<int> fds = pm.share(t, at(1) + kPage / 2, 2 * kPage);
  REQUIRE(fds.size() == 3);
  CHECK(fds[0] == static_cast<int>(vm.mapped.at(at(1))) + 1000);
  CHECK(fds[1] == static_cast<int>(vm.mapped.at(at(2))) + 1000);
  CHECK(fds[2] == static_cast<int>(vm.mapped.at(at(3))) + 1000);
  CHECK(vm.shares == 3);
  // A range with an unmapped page under it is no allocated block: refused, not guessed.
  CHECK_THROWS_AS(pm.share(t, at(4), kPage), gpukeeper::GpuError);
  pm.release(t, at(1) + kPage / 2, 2 * kPage, 0);
}
