// Catch2 2.x only (Catch2 3 links Catch2::Catch2WithMain instead): the test runner's main(),
// with what 2.x lacks. Catch2 2 has no SKIP, so GK_SKIP (catch.hpp) notes each skip here;
// after Catch's own summary this lists the skipped test cases, and exits with 4 when every
// test case that ran was skipped (what Catch2 3 does; ctest's SKIP_RETURN_CODE). And since
// `--warn NoAssertions` would fail a skipped test case, this does its check instead: a
// leaf section that asserted nothing and skipped nothing fails the run.
#define CATCH_CONFIG_RUNNER
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <cstdio>
#include <string>
#include <vector>

#include "catch.hpp"

namespace gktest {

namespace {

struct Frame {
  std::string name;
  bool has_child = false;
  bool skipped = false;
};

struct SkipBook {
  std::string test_case;
  std::vector<std::string> reasons;  // of the running test case
  std::vector<Frame> frames;         // the sections now running, outermost first
  std::size_t cases_run = 0;
  std::vector<std::string> skipped;         // "name: first reason"
  std::vector<std::string> partly_skipped;  // skipped some runs, passed others
  std::vector<std::string> silent;          // leaf sections without assertions or skips
};

SkipBook& book() {
  static SkipBook b;
  return b;
}

struct SkipListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    TestEventListenerBase::testCaseStarting(info);
    book().test_case = info.name;
    book().reasons.clear();
    book().frames.clear();
  }
  void sectionStarting(Catch::SectionInfo const& info) override {
    TestEventListenerBase::sectionStarting(info);
    if (!book().frames.empty()) book().frames.back().has_child = true;
    book().frames.push_back({info.name, false, false});
  }
  void sectionEnded(Catch::SectionStats const& stats) override {
    TestEventListenerBase::sectionEnded(stats);
    if (book().frames.empty()) return;
    Frame frame = book().frames.back();
    book().frames.pop_back();
    if (!frame.has_child && !frame.skipped && stats.assertions.total() == 0) {
      std::string where = book().test_case;
      if (frame.name != where) where += " / " + frame.name;
      book().silent.push_back(where);
    }
  }
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    TestEventListenerBase::testCaseEnded(stats);
    SkipBook& b = book();
    ++b.cases_run;
    if (b.reasons.empty() || stats.totals.assertions.failed != 0) return;
    std::string line = b.test_case + ": " + b.reasons.front();
    if (b.reasons.size() > 1) line += " (and " + std::to_string(b.reasons.size() - 1) + " more)";
    (stats.totals.assertions.passed == 0 ? b.skipped : b.partly_skipped).push_back(line);
  }
};

void print_list(const char* title, const std::vector<std::string>& lines) {
  if (lines.empty()) return;
  std::printf("%s (%zu):\n", title, lines.size());
  for (const std::string& line : lines) std::printf("  %s\n", line.c_str());
  std::fflush(stdout);
}

// Catch's exit code, amended by what the listener saw. Catch exits with the number of
// failed assertions; a failed run exits with 1 here, so that 4 failures never read as
// ctest's SKIP_RETURN_CODE 4 (every test case skipped).
int finish(int rc) {
  if (rc == 4) rc = 1;
  const SkipBook& b = book();
  print_list("SKIPPED test cases", b.skipped);
  print_list("partly skipped test cases (the rest of their runs passed)", b.partly_skipped);
  if (!b.silent.empty()) {
    print_list("FAILED: test cases or sections that neither asserted nor skipped anything",
               b.silent);
    return rc != 0 ? rc : 1;
  }
  if (rc == 0 && b.cases_run > 0 && b.skipped.size() == b.cases_run) {
    std::printf("every test case was skipped: exit code 4\n");
    std::fflush(stdout);
    return 4;
  }
  return rc;
}

}  // namespace

void note_skip(const std::string& reason) {
  SkipBook& b = book();
  b.reasons.push_back(reason);
  for (Frame& frame : b.frames) frame.skipped = true;
}

}  // namespace gktest

using gktest::SkipListener;
CATCH_REGISTER_LISTENER(SkipListener)

int main(int argc, char* argv[]) {
  Catch::Session session;
  const int rc = session.run(argc, argv);
  return gktest::finish(rc);
}
