// detail::FreeIndex: the size bins of free blocks behind the pool's best-fit search.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gpukeeper/memory/block.hpp"
#include "gpukeeper/memory/free_index.hpp"
#include "test_support.hpp"

using gpukeeper::detail::Block;
using gpukeeper::detail::FreeIndex;
using gktest::KiB;
using gktest::MiB;

namespace {

// Blocks that stay put while the index links them.
struct Blocks {
  std::vector<std::unique_ptr<Block>> all;
  Block* make(std::size_t size) {
    all.push_back(std::make_unique<Block>());
    Block* b = all.back().get();
    b->addr = 0x100000 + 256 * all.size();
    b->size = size;
    b->free = true;
    return b;
  }
};

}  // namespace

TEST_CASE("FreeIndex bins: exact below 16 KiB, monotonic, last bin for huge sizes",
          "[free_index]") {
  // One bin per 256-byte multiple below 64 units.
  for (std::size_t units = 1; units < FreeIndex::kLinearBins; ++units) {
    REQUIRE(FreeIndex::bin_of(units * 256) == units);
  }
  REQUIRE(FreeIndex::bin_of(16 * KiB) == FreeIndex::kLinearBins);
  // Never decreasing in size, so that any block of a later bin fits a request.
  std::uint32_t previous = 0;
  for (std::size_t size = 256; size < (std::size_t{1} << 40); size += size / 61 + 256) {
    std::size_t rounded = gktest::round_up(size);
    std::uint32_t bin = FreeIndex::bin_of(rounded);
    INFO("size " << rounded);
    REQUIRE(bin >= previous);
    REQUIRE(bin < FreeIndex::kBins);
    previous = bin;
  }
  // Bins above 16 KiB are narrow: 32 per power of two.
  REQUIRE(FreeIndex::bin_of(2 * MiB) - FreeIndex::bin_of(1 * MiB) == FreeIndex::kSubBins);
  REQUIRE(FreeIndex::bin_of(~std::size_t{0} & ~std::size_t{255}) == FreeIndex::kBins - 1);
}

TEST_CASE("FreeIndex: insert, best_fit, largest, remove keep count and bytes", "[free_index]") {
  auto index = std::make_unique<FreeIndex>();
  Blocks blocks;
  REQUIRE(index->empty());
  REQUIRE(index->best_fit(256) == nullptr);
  REQUIRE(index->largest() == nullptr);

  Block* b4k = blocks.make(4 * KiB);
  Block* b8k = blocks.make(8 * KiB);
  Block* b1m = blocks.make(1 * MiB);
  Block* b3m = blocks.make(3 * MiB);
  for (Block* b : {b4k, b8k, b1m, b3m}) index->insert(b);
  REQUIRE(index->count() == 4);
  REQUIRE(index->bytes() == 4 * KiB + 8 * KiB + 1 * MiB + 3 * MiB);

  SECTION("exact sizes are found exactly") {
    REQUIRE(index->best_fit(4 * KiB) == b4k);
    REQUIRE(index->best_fit(8 * KiB) == b8k);
    REQUIRE(index->best_fit(1 * MiB) == b1m);
    REQUIRE(index->best_fit(3 * MiB) == b3m);
  }
  SECTION("the smallest block that fits wins") {
    REQUIRE(index->best_fit(256) == b4k);
    REQUIRE(index->best_fit(4 * KiB + 256) == b8k);
    REQUIRE(index->best_fit(8 * KiB + 256) == b1m);
    REQUIRE(index->best_fit(1 * MiB + 256) == b3m);
    REQUIRE(index->best_fit(3 * MiB + 256) == nullptr);
  }
  SECTION("largest, and remove") {
    REQUIRE(index->largest() == b3m);
    index->remove(b3m);
    REQUIRE(index->largest() == b1m);
    REQUIRE(index->best_fit(1 * MiB + 256) == nullptr);
    REQUIRE(index->count() == 3);
    REQUIRE(index->bytes() == 4 * KiB + 8 * KiB + 1 * MiB);
    index->remove(b4k);
    index->remove(b8k);
    index->remove(b1m);
    REQUIRE(index->empty());
    REQUIRE(index->bytes() == 0);
    REQUIRE(index->best_fit(256) == nullptr);
    REQUIRE(index->largest() == nullptr);
  }
  SECTION("for_each visits every block once") {
    std::size_t n = 0, bytes = 0;
    index->for_each([&](Block* b) {
      ++n;
      bytes += b->size;
    });
    REQUIRE(n == 4);
    REQUIRE(bytes == index->bytes());
  }
  SECTION("blocks of one size: all are found, then none") {
    Block* twin = blocks.make(8 * KiB);
    index->insert(twin);
    Block* first = index->best_fit(8 * KiB);
    REQUIRE((first == b8k || first == twin));
    index->remove(first);
    Block* second = index->best_fit(8 * KiB);
    REQUIRE((second == b8k || second == twin));
    REQUIRE(second != first);
    index->remove(second);
    REQUIRE(index->best_fit(8 * KiB) == b1m);
  }
}

TEST_CASE("FreeIndex best_fit against a brute-force search", "[free_index]") {
  auto index = std::make_unique<FreeIndex>();
  Blocks blocks;
  std::vector<Block*> present;
  std::mt19937_64 rng(12345);
  auto random_size = [&] {
    // Log-uniform from 256 B to 256 MiB, in 256-byte units; many equal sizes below 16 KiB.
    double exponent = std::uniform_real_distribution<double>(8.0, 28.0)(rng);
    return gktest::round_up(static_cast<std::size_t>(std::pow(2.0, exponent)));
  };
  for (int step = 0; step < 20000; ++step) {
    if (present.size() < 50 || rng() % 3 != 0) {
      Block* b = blocks.make(random_size());
      index->insert(b);
      present.push_back(b);
    } else {
      std::size_t i = rng() % present.size();
      index->remove(present[i]);
      present[i] = present.back();
      present.pop_back();
    }
    if (step % 7 != 0) continue;
    std::size_t want = random_size();
    const Block* smallest_fit = nullptr;
    const Block* largest = nullptr;
    std::size_t bytes = 0;
    for (const Block* b : present) {
      bytes += b->size;
      if (b->size >= want && (!smallest_fit || b->size < smallest_fit->size)) smallest_fit = b;
      if (!largest || b->size > largest->size) largest = b;
    }
    INFO("step " << step << ", request " << want << ", " << present.size() << " blocks");
    REQUIRE(index->count() == present.size());
    REQUIRE(index->bytes() == bytes);
    REQUIRE(index->largest()->size == largest->size);
    const Block* got = index->best_fit(want);
    if (smallest_fit == nullptr) {
      REQUIRE(got == nullptr);
    } else {
      // Never misses a block that fits, and picks from the best block's bin.
      REQUIRE(got != nullptr);
      REQUIRE(got->size >= want);
      REQUIRE(FreeIndex::bin_of(got->size) == FreeIndex::bin_of(smallest_fit->size));
    }
  }
}
