// A caching pool's segment layout: where the blocks of each size class live. One
// interface (PoolLayout), one type per layout, each in its own pair of files
// (fixed_layout, expandable_layout, hybrid_layout), and one registry that names them,
// maps them to the words users type and settles `auto` (pool_layout.cpp, kLayouts).
//
//   auto layout = make_layout(resolve_layout(SegmentLayout::automatic, upstream));
//   layout->source(/*small=*/false);   // SegmentSource::expandable for hybrid
//
// A layout chooses; it does not place. The mechanics are parts that every layout shares,
// inside CachingPool: fixed segments (taken from the upstream whole, caching_pool.cpp)
// and expandable ranges (reserved addresses with pages mapped under the blocks handed
// out, caching_pool_expandable.cpp over detail::PagedMemory), beside the free indexes,
// counters, limits and pressure callbacks. The pool asks its layout once, when it is
// made, and keeps the answer as one flag per size class: no allocation, free or placement
// calls the layout, so the fast path has no virtual call and no indirection more than a
// pool without layouts (a new layout costs nothing per allocation either).
//
// One word per layout, the same in C++ (to_string) and Python (kLayouts):
//   word          Python: MemoryPool(expandable=...),   C++: PoolOptions::segments   type
//                         use_torch_allocator(...)
//   "auto"        "auto" (the default)                  SegmentLayout::automatic     settled by resolve_layout
//   "fixed"       "fixed", or False                     SegmentLayout::fixed         FixedLayout
//   "expandable"  "expandable", or True                 SegmentLayout::expandable    ExpandableLayout
//   "hybrid"      "hybrid"                              SegmentLayout::hybrid        HybridLayout
// (The enum's value for "auto" is spelled `automatic`: `auto` is a C++ keyword. Python's
// True and False are the `expandable=` parameter's yes and no; "large", the former word
// for hybrid, is read with a deprecation warning until the next release.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gpukeeper {

class MemoryResource;

// How a pool lays out its segments (PoolOptions::segments). A new layout adds its value
// here and its row to kLayouts (pool_layout.cpp).
enum class SegmentLayout : std::uint8_t {
  // The default. Hybrid where the upstream is device memory with virtual memory
  // management: reserved memory then stays within 5 % of the most requested at once on
  // every recorded trace, where fixed segments hold 1.15-3.40 times it
  // (docs/performance.md). Fixed elsewhere: host memory, and upstreams without virtual
  // memory (pinned, async, a device or driver without the support).
  automatic,
  fixed,       // segments from the upstream, each kept whole until released
  expandable,  // every size class in expandable ranges
  // Requests over small_size in expandable ranges, small ones in fixed segments: no page
  // is ever moved for them (most operations of a training step are small), and their
  // waste is bounded by what small segments can strand, a small share of the footprint.
  hybrid,
};

// Where the blocks of one size class live.
enum class SegmentSource : std::uint8_t {
  fixed,       // segments taken from the upstream whole, each kept until released
  expandable,  // one reserved address range per class, pages mapped under live blocks
};

// What a layout decides. Asked when a pool is made, never on the allocation path.
class PoolLayout {
 public:
  virtual ~PoolLayout();
  // The layout's name in PoolOptions::segments (never automatic).
  virtual SegmentLayout id() const noexcept = 0;
  // Where requests of a size class live: small ones (up to PoolOptions::small_size) or
  // the rest.
  virtual SegmentSource source(bool small) const noexcept = 0;
  // Whether any class lives in expandable ranges: the upstream must offer virtual memory.
  bool uses_expandable() const noexcept {
    return source(true) == SegmentSource::expandable || source(false) == SegmentSource::expandable;
  }
};

// ---- the registry (pool_layout.cpp)

// The layout `asked` stands for over `upstream`: automatic becomes hybrid where the
// upstream is device memory with virtual memory management, else fixed; any other is
// itself.
SegmentLayout resolve_layout(SegmentLayout asked, MemoryResource& upstream);
// The type of `layout`; InvalidInputError for automatic (resolve it first).
std::unique_ptr<PoolLayout> make_layout(SegmentLayout layout);
// Whether `layout`, asked for explicitly, needs the upstream's virtual memory (automatic
// does not: it falls back to fixed segments).
bool layout_needs_virtual_memory(SegmentLayout layout);
const char* to_string(SegmentLayout layout) noexcept;

// What Python's `expandable` property gives for a layout, as Python writes the value
// ("'auto'", "True", "False", "'hybrid'"): the layout's word (to_string) quoted, or the
// parameter's yes/no shorthand for expandable and fixed.
const char* python_spelling(SegmentLayout layout) noexcept;
// The layout that `spelling` (as Python writes a value of `expandable=`) names: a
// python_spelling, or any layout's word quoted ("'fixed'", "'expandable'"); false when
// none does. `former` (when given) is set for a spelling kept one more release ("'large'",
// now "'hybrid'").
bool layout_from_python(const std::string& spelling, SegmentLayout& out,
                        bool* former = nullptr) noexcept;
// Every spelling, for error messages: "'auto', True, False or 'hybrid'".
std::string python_spellings();

}  // namespace gpukeeper
