// What one page move of an expandable segment costs, call by call, on the device:
// warm replays of the expandable layouts are slow only because of page moves,
// so which driver call dominates decides what to change (fewer calls, batched calls, or
// calls off the hot path). Every row goes through gpukeeper's VirtualMemory
// (cuda_virtual_memory.cpp), the code the pool runs. Rows, each timed call by call on an
// idle device (median, p10, p90 of --reps calls, µs):
//
//   create + release          one physical page made and freed (cuMemCreate, cuMemRelease)
//   map                       a page mapped at an unmapped address (cuMemMap)
//   set_access, 1 page        the access grant of one freshly mapped page (cuMemSetAccess)
//   unmap                     one page unmapped (cuMemUnmap)
//   move                      unmap at A + map at B + set_access at B: what the pool does
//   run of N: map + 1 grant   N pages mapped one by one and one grant over the run, per page
//   run of N: unmap           N pages unmapped, per page
//   alias map + grant         a page mapped at B while still mapped at A (no unmap first)
//
// Without a usable CUDA device (or without virtual memory management) nothing is
// measured: the program says so and exits 0.
//
//   page_move_bench [--json PATH] [--reps N]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gpukeeper/memory/cuda_virtual_memory.hpp"

using namespace gkbench;

namespace {

struct Result {
  std::string key, label;
  Summary us;
};

// Times `op` `reps` times, call by call; `between` runs untimed after each call.
Result time_calls(const std::string& key, const std::string& label, int reps, double per,
                  const std::function<void(int)>& op, const std::function<void(int)>& between) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    op(i);
    auto t1 = Clock::now();
    between(i);
    us.push_back(elapsed_ns(t0, t1) / 1000.0 / per);
  }
  return Result{key, label, summarize(us)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 3) {
        std::fprintf(stderr, "--reps must be at least 3\n");
        return 2;
      }
    } else {
      std::puts("usage: page_move_bench [--json PATH] [--reps N]");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::printf("%s", environment_line().c_str());
  std::string why;
  if (!gpukeeper::cuda_virtual_memory_supported(0, &why)) {
    std::printf("NOTE: nothing measured: %s\n", why.c_str());
    return 0;
  }
  constexpr std::size_t kRun = 8;
  std::vector<Result> results;
  try {
    auto vm = gpukeeper::make_cuda_virtual_memory(0);
    const std::size_t page = vm->page_size();
    const std::size_t slots = 4 * kRun;
    const std::uintptr_t base = vm->reserve(slots * page);
    if (base == 0) throw std::runtime_error("cuMemAddressReserve found no address space");
    auto at = [&](std::size_t slot) { return base + slot * page; };
    std::vector<gpukeeper::VirtualMemory::page_t> pages(kRun);
    for (auto& p : pages) {
      p = vm->create_page();
      if (p == 0) throw std::runtime_error("cuMemCreate: out of memory");
    }
    auto nothing = [](int) {};

    results.push_back(time_calls("create_release", "create + release", reps, 1.0, [&](int) {
      gpukeeper::VirtualMemory::page_t p = vm->create_page();
      vm->release_page(p);
    }, nothing));
    // map alone, then its grant and unmap untimed; and the other two the same way.
    results.push_back(time_calls("map", "map", reps, 1.0, [&](int) { vm->map(at(0), pages[0]); },
                                 [&](int) {
                                   vm->set_access(at(0), page);
                                   vm->unmap(at(0));
                                 }));
    // The grant of a page mapped (untimed) just before.
    vm->map(at(0), pages[0]);
    results.push_back(time_calls("set_access_1", "set_access, 1 page", reps, 1.0,
                                [&](int) { vm->set_access(at(0), page); },
                                [&](int) {
                                  vm->unmap(at(0));
                                  vm->map(at(0), pages[0]);
                                }));
    vm->unmap(at(0));
    vm->map(at(0), pages[0]);
    vm->set_access(at(0), page);
    results.push_back(time_calls("unmap", "unmap", reps, 1.0, [&](int) { vm->unmap(at(0)); },
                                 [&](int) {
                                   vm->map(at(0), pages[0]);
                                   vm->set_access(at(0), page);
                                 }));
    // The pool's move: the page leaves slot 0 for slot 1, then back, alternately.
    results.push_back(time_calls("move", "move (unmap + map + set_access)", reps, 1.0, [&](int i) {
      std::size_t from = i % 2, to = 1 - from;
      vm->unmap(at(from));
      vm->map(at(to), pages[0]);
      vm->set_access(at(to), page);
    }, nothing));
    vm->unmap(at(reps % 2));
    const std::string run = std::to_string(kRun);
    // Slots kRun.. hold the run: mapped one by one, one grant over all of it.
    auto map_run = [&] {
      for (std::size_t k = 0; k < kRun; ++k) vm->map(at(kRun + k), pages[k]);
      vm->set_access(at(kRun), kRun * page);
    };
    results.push_back(time_calls("run_map_grant", "run of " + run + ": map + 1 grant, per page", reps,
                                 static_cast<double>(kRun), [&](int) { map_run(); }, [&](int) {
      for (std::size_t k = 0; k < kRun; ++k) vm->unmap(at(kRun + k));
    }));
    map_run();
    results.push_back(time_calls("run_unmap", "run of " + run + ": unmap, per page", reps,
                                 static_cast<double>(kRun), [&](int) {
      for (std::size_t k = 0; k < kRun; ++k) vm->unmap(at(kRun + k));
    }, [&](int) { map_run(); }));
    // The page stays mapped at slot kRun; a second mapping at another slot comes and goes.
    results.push_back(time_calls("alias_map_grant", "alias map + grant (no unmap)", reps, 1.0, [&](int) {
      vm->map(at(2 * kRun), pages[0]);
      vm->set_access(at(2 * kRun), page);
    }, [&](int) { vm->unmap(at(2 * kRun)); }));
    for (std::size_t k = 0; k < kRun; ++k) vm->unmap(at(kRun + k));
    for (auto p : pages) vm->release_page(p);
    vm->unreserve(base, slots * page);
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }

  std::printf("\n%-44s %10s %10s %10s\n", "call (2 MiB pages, idle device)", "median us", "p10", "p90");
  for (const Result& r : results) {
    std::printf("%-44s %10.2f %10.2f %10.2f\n", r.label.c_str(), r.us.median, r.us.p10, r.us.p90);
  }
  if (!json_path.empty()) {
    std::vector<std::string> rows;
    for (const Result& r : results) {
      JsonObject o;
      o.str("call", r.key).str("label", r.label).summary("us_", r.us);
      rows.push_back(o.dump(4));
    }
    JsonObject top;
    top.str("benchmark", "page_move_bench").raw("environment", environment_json().dump(2));
    top.integer("reps", static_cast<std::uint64_t>(reps)).raw("rows", json_array(rows, 2));
    if (!write_json_report(json_path, top.dump())) return 1;
  }
  return 0;
}
