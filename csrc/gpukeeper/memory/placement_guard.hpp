// PlacementGuard: per size class of blocks over one page, whether placing them in the
// lowest free block on mapped pages keeps moving pages; such a class is placed in size
// order for a while instead.
//
// Placed lowest-first, a training step's large blocks land where the step before left
// mapped pages, and a warm pool maps nothing (CachingPool::own_fit). Where the pages held
// fall a page or so short of what that layout needs at its peak, the lowest-first layout
// can instead settle into a cycle: each step one block of a class finds its mapped run a
// page short and a page moves to it, the next step another block of the class shifts
// and the page moves again (on a molecular-dynamics trace, one page between three
// addresses every step: 8.9 moves per 1 000 operations where size order moved 0.01).
// A class whose placements moved pages twice within a short window is taken for such a
// cycle rather than a warm-up or a change of workload, and goes back to size order (the
// smallest of the first mapped fits), which such repeated steps place stably; after a
// long while it tries lowest-first again.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace gpukeeper::detail {

class PlacementGuard {
 public:
  // Moves, each within kWindow placements of the class's last one, that mark a cycle.
  // Three broke the molecular-dynamics cycle as well; two moved a little fewer pages on
  // random-walk traces.
  static constexpr unsigned kStrikes = 2;
  // Placements of the class (of blocks over one page, counted together): a step of the
  // recorded traces makes tens to a few hundred of them.
  static constexpr std::uint64_t kWindow = 1024;
  // Placements that a class found cycling stays in size order, doubled each time it is
  // found cycling again. With a quarter of this, the recorded molecular-dynamics trace
  // (59 000 placements over one page a pass) fell back into its cycle about once a pass.
  static constexpr std::uint64_t kHold = 256 * kWindow;

  // A block of `size` bytes (over one page) is being placed: whether lowest-first may
  // place it. Counts the placement.
  bool lowest_first(std::size_t size) noexcept {
    ++clock_;
    return clock_ >= classes_[class_of(size)].held_until;
  }
  // Placing a block of `size` bytes moved pages. Only moves of lowest-first placements
  // count: size order may move pages too, which says nothing of a cycle.
  void moved(std::size_t size) noexcept {
    Class& c = classes_[class_of(size)];
    if (clock_ < c.held_until) return;
    c.strikes = clock_ - c.last_move <= kWindow ? c.strikes + 1 : 1;
    c.last_move = clock_;
    if (c.strikes >= kStrikes) {
      // Each cycle found again holds twice as long: retries cost a vanishing share.
      c.held_until = clock_ + (kHold << std::min(c.cycles, 20u));
      ++c.cycles;
      c.strikes = 0;
    }
  }

 private:
  struct Class {
    std::uint64_t last_move = 0;
    std::uint64_t held_until = 0;
    unsigned strikes = 0;
    unsigned cycles = 0;  // times found cycling
  };
  // Powers of two of bytes: a class's sizes drift by a few percent from step to step.
  static unsigned class_of(std::size_t size) noexcept {
    return 63u - static_cast<unsigned>(__builtin_clzll(size));
  }
  std::uint64_t clock_ = 0;
  std::array<Class, 64> classes_{};
};

}  // namespace gpukeeper::detail
