"""Summarises a conformance run.

Reads, from the results directory written by run.sh, each target's start-up check
(`<target>.startup.json`) and each suite's pytest junit XML (`<target>-<suite>.xml`) and run
record (`<target>-<suite>.run.json`). Prints one table row per target and suite (tests passed,
failed, errored, skipped, counted once per test id), writes `summary.json` and one
`<target>-<suite>.failed.txt` per suite (the ids that did not pass), and exits non-zero unless
every selected suite started and every test it did not skip passed or is an expected failure.

Expected failures (EXPECTED_FILE, optional): one test per line, `<target> <test id> | <reason>`
(lines starting with `#` are comments). A listed test that fails is counted as expected; a failure that is not
listed fails the run, and so does a listed test that ran and did not fail (the list may only
shrink: remove it). A listed test that did not run (deselected with -k) is reported only.

Usage: report.py RESULTS_DIR TARGETS SUITES [EXPECTED_FILE]   (comma-separated lists)
"""

import datetime
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

PYMONGO_VERSION = "4.20.1"


def outcome(case):
    """One test's outcome from its junit element (failure wins over error, error over skip)."""
    tags = {child.tag for child in case}
    if "failure" in tags:
        return "failed"
    if "error" in tags:
        return "errors"
    if "skipped" in tags:
        return "skipped"
    return "passed"


def test_id(case):
    """pytest's node id: file::Class::test, rebuilt from the junit classname and name."""
    parts = case.get("classname", "").split(".")
    # classname is test.test_crud_unified.TestUnifiedX: module path, then the class.
    module, cls = parts[:-1], parts[-1:]
    return "/".join(module) + ".py::" + "::".join(cls + [case.get("name", "")])


def first_line(case):
    """The first line of a non-passing test's message, to group failures by cause."""
    for child in case:
        if child.tag in ("failure", "error", "skipped"):
            msg = child.get("message") or (child.text or "")
            return msg.strip().splitlines()[0][:300] if msg.strip() else ""
    return ""


def read_suite(results, target, suite):
    xml_path = os.path.join(results, f"{target}-{suite}.xml")
    run_path = os.path.join(results, f"{target}-{suite}.run.json")
    row = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    run = {}
    if os.path.exists(run_path):
        with open(run_path) as f:
            run = json.load(f)
    row.update({k: run[k] for k in ("exit_code", "seconds", "timed_out") if k in run})
    not_passed = []
    outcomes = {}
    seen = {}
    if os.path.exists(xml_path):
        try:
            root = ET.parse(xml_path).getroot()
        except ET.ParseError as exc:
            row["xml_error"] = str(exc)
            root = None
        if root is not None:
            for case in root.iter("testcase"):
                seen[test_id(case)] = case
    else:
        row["xml_error"] = "no junit XML written"
    for tid, case in sorted(seen.items()):
        result = outcome(case)
        outcomes[tid] = result
        row[result] += 1
        row["tests"] += 1
        if result in ("failed", "errors"):
            not_passed.append({"id": tid, "outcome": result, "message": first_line(case)})
    row["junit"] = xml_path
    return row, not_passed, outcomes


def read_expected(path):
    """The expected-failure list: {(target, test id): reason}."""
    expected = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            head, sep, reason = line.partition("|")
            parts = head.split()
            if not sep or len(parts) != 2 or not reason.strip():
                sys.exit(f"{path}:{n}: expected '<target> <test id> | <reason>', got: {line}")
            expected[(parts[0], parts[1])] = reason.strip()
    return expected


def verdict(startup, row):
    if not startup.get("started"):
        return "NOT STARTED"
    if row.get("timed_out"):
        return "TIMEOUT"
    if "xml_error" in row:
        return "NO RESULTS"
    if not row["tests"]:
        return "FAIL"
    if row["unexpected"] or row["now_passing"]:
        return "FAIL"
    # pytest exits 1 when a test failed (expected ones too); anything else is a broken run.
    if row.get("exit_code") not in (0, None) and not (row["exit_code"] == 1 and row["expected"]):
        return "FAIL"
    return "ok"


def git_commit(root):
    try:
        return subprocess.run(
            ["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    results, targets, suites = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    expected_file = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
    expected = read_expected(expected_file) if expected_file else {}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(root),
        "pymongo": PYMONGO_VERSION,
        "expected_failures_file": expected_file,
        "targets": {},
    }
    problems = []
    rows = []
    all_ok = True
    for target in targets:
        startup_path = os.path.join(results, f"{target}.startup.json")
        startup = {"started": False, "error": "no start-up record"}
        if os.path.exists(startup_path):
            try:
                with open(startup_path) as f:
                    startup = json.load(f)
            except ValueError as exc:
                startup = {"started": False, "error": f"unreadable start-up record: {exc}"}
        entry = {"startup": startup, "suites": {}}
        for suite in suites:
            row, not_passed, outcomes = read_suite(results, target, suite)
            prefix = f"test/test_{suite}_unified.py::"
            listed = [tid for (t, tid) in expected if t == target and tid.startswith(prefix)]
            row["expected"] = sum(1 for t in not_passed if (target, t["id"]) in expected)
            unexpected = [t for t in not_passed if (target, t["id"]) not in expected]
            now_passing = [tid for tid in listed if outcomes.get(tid) in ("passed", "skipped")]
            not_run = [tid for tid in listed if tid not in outcomes]
            row["unexpected"] = len(unexpected)
            row["now_passing"] = len(now_passing)
            row["result"] = verdict(startup, row)
            all_ok &= row["result"] == "ok"
            for t in unexpected:
                problems.append(f"  {target}: FAILED, not in the expected-failure list: {t['id']}\n      {t['message']}")
            for tid in now_passing:
                problems.append(f"  {target}: listed as an expected failure but {outcomes[tid]} (remove it from the list): {tid}")
            for tid in not_run:
                problems.append(f"  {target}: listed as an expected failure, not run (deselected?): {tid}")
            entry["suites"][suite] = dict(
                row,
                not_passed=[t["id"] for t in not_passed],
                unexpected_failures=[t["id"] for t in unexpected],
                listed_but_not_failing=now_passing,
            )
            with open(os.path.join(results, f"{target}-{suite}.failed.txt"), "w") as f:
                for t in not_passed:
                    mark = "expected" if (target, t["id"]) in expected else t["outcome"]
                    f.write(f"{mark}\t{t['id']}\t{t['message']}\n")
            rows.append((target, suite, row))
        summary["targets"][target] = entry
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)

    print()
    commit = summary["commit"] or "unknown (not a git checkout)"
    print(f"pymongo {PYMONGO_VERSION} unified specification suites, commit {commit}")
    for target in targets:
        startup = summary["targets"][target]["startup"]
        if startup.get("started"):
            d = startup.get("detected", {})
            print(
                f"  {target}: suite set-up completed (topology {d.get('topology')}, "
                f"server {d.get('version')}, test commands "
                f"{'on' if d.get('test_commands_enabled') else 'off'})"
            )
        else:
            print(f"  {target}: SUITE SET-UP FAILS, every test errors before it runs:")
            print(f"      {startup.get('error')}")
            if startup.get("where"):
                print(f"      at {startup['where']}")
        for key, value in (startup.get("server") or {}).items():
            print(f"      server {key}: {value}")
    print()
    header = ("target", "suite", "tests", "passed", "failed", "errors", "skipped", "expected", "result")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    totals = {"passed": 0, "failed": 0, "skipped": 0, "expected": 0}
    for target, suite, row in rows:
        cells = [target, suite] + [str(row[k]) for k in header[2:8]] + [row["result"]]
        print("| " + " | ".join(cells) + " |")
        totals["passed"] += row["passed"]
        totals["failed"] += row["failed"] + row["errors"]
        totals["skipped"] += row["skipped"]
        totals["expected"] += row["expected"]
    print()
    if expected_file:
        print(f"expected failures: {expected_file} (the 'expected' column: failed as listed)")
    for p in problems:
        print(p)
    if problems:
        print()
    print(f"results: {results}/ (summary.json, junit XML, *.failed.txt, pytest and server logs)")
    # The plain closing line: errors (tests that could not run) count as failed.
    print(
        f"conformance: {totals['passed']} passed, {totals['failed']} failed "
        f"({totals['expected']} expected), {totals['skipped']} skipped"
    )
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
