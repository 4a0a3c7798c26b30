// Address -> Block lookup for live allocations: open addressing with linear probing and
// backward-shift deletion (no tombstones), so a free() finds its block in a few cache
// lines and never calls the C allocator except when the table grows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpukeeper::detail {

template <typename V>
class PtrMap {
 public:
  PtrMap() { slots_.resize(kInitialSlots); }

  std::size_t size() const noexcept { return size_; }

  V* find(std::uintptr_t key) const noexcept {
    if (key == 0) return nullptr;
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return slot.value;
      if (slot.key == 0) return nullptr;
    }
  }

  // The key must not be present.
  void insert(std::uintptr_t key, V* value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.size() * 2);
    place(key, value);
    ++size_;
  }

  // Removes and returns the value, or nullptr when the key is absent.
  V* erase(std::uintptr_t key) noexcept {
    if (key == 0) return nullptr;
    std::size_t i = index(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask();
    }
    V* value = slots_[i].value;
    // Shift later members of the probe run back so that lookups never stop early.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      std::size_t home = index(slots_[j].key);
      bool movable = (hole <= j) ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return value;
  }

  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& slot : slots_) {
      if (slot.key != 0) f(slot.key, slot.value);
    }
  }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    V* value = nullptr;
  };
  static constexpr std::size_t kInitialSlots = 1024;

  std::size_t mask() const noexcept { return slots_.size() - 1; }
  std::size_t index(std::uintptr_t key) const noexcept {
    // Addresses are 256-byte aligned: drop the zero bits, then Fibonacci hashing.
    std::uint64_t h = static_cast<std::uint64_t>(key >> 8) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> 32) & mask();
  }
  void place(std::uintptr_t key, V* value) noexcept {
    std::size_t i = index(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = Slot{key, value};
  }
  void rehash(std::size_t new_slots) {
    std::vector<Slot> old(new_slots);
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (slot.key != 0) place(slot.key, slot.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace gpukeeper::detail
