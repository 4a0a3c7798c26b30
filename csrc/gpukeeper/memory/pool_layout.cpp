// The registry of pool layouts (pool_layout.hpp): every layout's names, the word users
// type for it, its type, and how `automatic` is settled. A new layout is one row here.
#include "gpukeeper/memory/pool_layout.hpp"

#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/expandable_layout.hpp"
#include "gpukeeper/memory/fixed_layout.hpp"
#include "gpukeeper/memory/hybrid_layout.hpp"
#include "gpukeeper/memory/resource.hpp"

namespace gpukeeper {

PoolLayout::~PoolLayout() = default;

namespace {

template <class Layout>
std::unique_ptr<PoolLayout> make() {
  return std::make_unique<Layout>();
}

struct LayoutEntry {
  SegmentLayout layout;
  // The layout's word, the same in C++ (to_string) and Python (MemoryPool(expandable=
  // 'word'), use_torch_allocator(expandable='word')).
  const char* name;
  // What Python's `expandable` property gives for it, as Python writes the value: the
  // word quoted, or the parameter's yes/no shorthand (True, False), also accepted.
  const char* python;
  std::unique_ptr<PoolLayout> (*make)();  // nullptr: settled by resolve_layout
};

// In the order error messages list the Python spellings.
const LayoutEntry kLayouts[] = {
    {SegmentLayout::automatic, "auto", "'auto'", nullptr},
    {SegmentLayout::expandable, "expandable", "True", &make<ExpandableLayout>},
    {SegmentLayout::fixed, "fixed", "False", &make<FixedLayout>},
    {SegmentLayout::hybrid, "hybrid", "'hybrid'", &make<HybridLayout>},
};

// Former Python spellings, still read (with a deprecation warning) until the next release.
struct FormerSpelling {
  const char* python;
  SegmentLayout layout;
};
const FormerSpelling kFormer[] = {{"'large'", SegmentLayout::hybrid}};

const LayoutEntry* entry(SegmentLayout layout) noexcept {
  for (const LayoutEntry& e : kLayouts) {
    if (e.layout == layout) return &e;
  }
  return nullptr;
}

}  // namespace

SegmentLayout resolve_layout(SegmentLayout asked, MemoryResource& upstream) {
  if (asked != SegmentLayout::automatic) return asked;
  if (upstream.kind() != ResourceKind::device) return SegmentLayout::fixed;
  try {
    if (upstream.virtual_memory() != nullptr) return SegmentLayout::hybrid;
  } catch (const DeviceError&) {
    // No virtual memory management on this device or driver: fixed segments, which need
    // none. Asked for explicitly, expandable segments raise this error instead.
  }
  return SegmentLayout::fixed;
}

std::unique_ptr<PoolLayout> make_layout(SegmentLayout layout) {
  const LayoutEntry* e = entry(layout);
  if (e == nullptr || e->make == nullptr) {
    throw InvalidInputError(std::string("no pool layout is called ") + to_string(layout) +
                            "; resolve_layout() settles auto");
  }
  return e->make();
}

bool layout_needs_virtual_memory(SegmentLayout layout) {
  const LayoutEntry* e = entry(layout);
  return e != nullptr && e->make != nullptr && e->make()->uses_expandable();
}

const char* to_string(SegmentLayout layout) noexcept {
  const LayoutEntry* e = entry(layout);
  return e != nullptr ? e->name : "unknown";
}

const char* python_spelling(SegmentLayout layout) noexcept {
  const LayoutEntry* e = entry(layout);
  return e != nullptr ? e->python : "None";
}

bool layout_from_python(const std::string& spelling, SegmentLayout& out,
                        bool* former) noexcept {
  if (former != nullptr) *former = false;
  for (const LayoutEntry& e : kLayouts) {
    if (spelling == e.python || spelling == std::string("'") + e.name + "'") {
      out = e.layout;
      return true;
    }
  }
  for (const FormerSpelling& f : kFormer) {
    if (spelling == f.python) {
      out = f.layout;
      if (former != nullptr) *former = true;
      return true;
    }
  }
  return false;
}

std::string python_spellings() {
  std::string out;
  const std::size_t n = sizeof(kLayouts) / sizeof(kLayouts[0]);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += kLayouts[i].python;
  }
  return out;
}

}  // namespace gpukeeper
