"""Compares two runs of the same suite (CuPy's own pool vs gpukeeper's): outcome counts
per test folder and every test whose outcome differs, over the tests both runs finished.

    python tests/external/compare_runs.py default.log gpukeeper.log [--json out.json]

Each input is a pytest -v log (one "PASSED/FAILED/... test id" line per test, also with
pytest-xdist, so a run cut short still counts what it finished) or a JUnit XML report.
Exit status 1 when a test passes on the first run and fails or errors on the second.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import xml.etree.ElementTree as ET
from typing import Dict, Tuple


_VERBOSE = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+::\S.*?)\s*$")
_VERBOSE_ID_FIRST = re.compile(r"^(\S+::\S.*?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_WORDS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
          "XFAIL": "xfailed", "XPASS": "xpassed"}


def outcomes(path: str) -> Dict[str, str]:
    """test id -> passed / failed / error / skipped / xfailed / xpassed."""
    if not path.endswith(".xml"):
        return _log_outcomes(path)
    return _junit_outcomes(path)


def _log_outcomes(path: str) -> Dict[str, str]:
    result: Dict[str, str] = {}
    with open(path, errors="replace") as fh:
        for line in fh:
            line = line.rstrip()
            m = _VERBOSE.search(line)
            if m:
                word, test_id = m.group(1), m.group(2)
            else:
                m = _VERBOSE_ID_FIRST.search(line)
                if not m:
                    continue
                test_id, word = m.group(1), m.group(2)
            test_id = test_id.split(" - ")[0]
            result.setdefault(test_id, _WORDS[word])
    return result


def _junit_outcomes(path: str) -> Dict[str, str]:
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            result[test_id] = "failed"
        elif "error" in kinds:
            result[test_id] = "error"
        elif "skipped" in kinds:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def folder(test_id: str) -> str:
    head = test_id.split("::")[0]
    if "/" in head:  # a path: its folder
        return head.rsplit("/", 1)[0]
    parts = head.split(".")
    return ".".join(parts[:3]) if len(parts) >= 3 else parts[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--json")
    args = parser.parse_args()
    a_all, b_all = outcomes(args.first), outcomes(args.second)
    both = set(a_all) & set(b_all)
    print(f"finished: {len(a_all)} (first), {len(b_all)} (second), {len(both)} by both; "
          "compared on those")
    a = {t: a_all[t] for t in both}
    b = {t: b_all[t] for t in both}
    counts: Dict[Tuple[str, str], collections.Counter] = {}
    for name, run in (("first", a), ("second", b)):
        for test_id, outcome in run.items():
            counts.setdefault((folder(test_id), name), collections.Counter())[outcome] += 1
    folders = sorted({f for f, _ in counts})
    print(f"{'folder':<40}{'run':<8}{'passed':>8}{'failed':>8}{'error':>7}{'skipped':>9}")
    table = []
    for f in folders:
        for name in ("first", "second"):
            c = counts.get((f, name), collections.Counter())
            table.append({"folder": f, "run": name, **dict(c)})
            print(f"{f:<40}{name:<8}{c['passed']:>8}{c['failed']:>8}{c['error']:>7}{c['skipped']:>9}")
    total = {name: collections.Counter(run.values()) for name, run in (("first", a), ("second", b))}
    print("total:", {k: dict(v) for k, v in total.items()})
    differ = sorted(t for t in set(a) | set(b) if a.get(t) != b.get(t))
    regressions = [t for t in differ if a.get(t) == "passed" and b.get(t) in ("failed", "error")]
    print(f"{len(differ)} test(s) differ; {len(regressions)} pass on the first run only")
    for t in differ[:200]:
        print(f"  {a.get(t, 'absent'):>8} -> {b.get(t, 'absent'):<8} {t}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"finished": [len(a_all), len(b_all), len(both)], "table": table, "total": {k: dict(v) for k, v in total.items()},
                       "differ": {t: [a.get(t), b.get(t)] for t in differ},
                       "regressions": regressions}, fh, indent=1)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
