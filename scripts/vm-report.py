#!/usr/bin/env python3
"""Write docs/vm-matrix.md from the results of `./dev vm-test`.

Usage: vm-report.py RESULTS_DIR OUT.md

RESULTS_DIR holds one directory per matrix entry (target/vm/results/<entry>/)
with the files the guest wrote: summary.json (each test's outcome),
status.json (the --json-status of a `confine run -- /bin/true` in that
guest), guest.txt and doctor.json. Each cell of the table is the level the
guest's own job reported for that guarantee, and the tests behind it with
how many of them passed there.
"""
import json
import os
import sys

ENTRIES = ["debian12", "debian11", "debian13", "debian12-v1"]

# The tests (suite::name) that back each guarantee row. A name that no
# longer exists in a suite fails the report: the mapping must not rot.
BACKING = {
    "filesystem": [
        "sandbox::system_paths_are_read_only_and_tmp_is_private",
        "sandbox::workspace_is_read_only_unless_rw",
        "security::sandbox::class04_git_stays_read_only_in_a_rw_workspace",
        "security::sandbox::class01_paths_through_a_symlink_a_job_planted_are_refused",
    ],
    "network": [
        "sandbox::inside_view_is_isolated",
        "sandbox::host_network_on_request",
        "security::governance::class11_a_job_with_host_network_cannot_use_the_server",
    ],
    "syscalls": [
        "security::sandbox::posture_of_a_job_is_exactly_as_expected",
        "security::sandbox::class09_memfd_secret_and_cachestat_are_refused",
        "security::sandbox::class04_setuid_setgid_and_file_capabilities_are_refused",
    ],
    "memory": [
        "limits::memory_limit_ends_as_oom_with_137",
    ],
    "cpu": [
        "limits::cpu_quota_gives_about_half_a_core",
        "limits::cpu_time_limit_ends_as_timeout",
    ],
    "pids": [
        "limits::fork_bomb_is_contained_and_the_host_stays_responsive",
    ],
    "treeKill": [
        "sandbox::setsid_grandchild_dies_with_the_job",
        "sandbox::a_killed_supervisor_takes_the_job_tree_with_it",
        "limits::double_fork_and_setsid_die_after_exit_and_after_timeout",
        "limits::stopped_processes_are_killed",
        "limits::sigterm_to_confine_cancels_and_kills_the_tree",
    ],
    "envScrub": [
        "sandbox::supervisor_environment_does_not_leak",
    ],
}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    results, out = sys.argv[1], sys.argv[2]
    entries = [e for e in ENTRIES if os.path.exists(os.path.join(results, e, "summary.json"))]
    if not entries:
        sys.exit("vm-report: no results in %s: run ./dev vm-test first" % results)
    rows = []
    head = []
    for entry in entries:
        d = os.path.join(results, entry)
        summary = load(os.path.join(d, "summary.json"))
        status = load(os.path.join(d, "status.json")) or {}
        outcomes = {}
        for suite, s in summary["suites"].items():
            for test, result in s.get("tests", {}).items():
                outcomes["%s::%s" % (suite, test)] = result
        layers = status.get("layers", {})
        landlock = layers.get("landlock", {})
        passed = sum(1 for r in outcomes.values() if r == "ok")
        failed = sum(1 for r in outcomes.values() if r == "FAILED")
        head.append(
            "| %s | %s | %s | %s | %s | %d passed, %d failed | %s, %d s, at %s |"
            % (
                entry,
                (summary.get("guest") or "did not boot").split(",")[0].replace("vm-guest: kernel ", ""),
                layers.get("cgroup") or "none",
                "ABI %s (%s)" % (landlock.get("abi"), landlock.get("status")) if landlock else "?",
                {True: "yes", False: "no"}.get(summary.get("degraded"), "?"),
                passed,
                failed,
                summary.get("accel"),
                summary.get("seconds", 0),
                summary.get("commit") or "?",
            )
        )
        guarantees = status.get("guarantees", {})
        rows.append((entry, guarantees, outcomes))

    lines = [
        "# The VM test matrix",
        "",
        "Written by `scripts/vm-report.py` from the last `./dev vm-test` run",
        "(`target/vm/results/`): each entry is a Debian guest booted with qemu,",
        "its own kernel and cgroup layout, running the root integration suites",
        "(`tests/suite/sandbox.rs`, `tests/suite/limits.rs`, `tests/suite/security/`) with",
        "`CONFINE_REQUIRE_ISOLATION=1`, where a skip is a failure.",
        "",
        "| entry | kernel | cgroup layer | landlock | needs --allow-degraded | tests | run |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += head
    lines += [
        "",
        "## What each guest enforced",
        "",
        "Each cell is the level that a `confine run --json-status` job in that",
        "guest reported for the row (`guarantees` in its outcome), then how many",
        "of the tests backing the row passed there. The tests are listed below.",
        "",
        "| guarantee | " + " | ".join(e for e, _, _ in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for name, tests in BACKING.items():
        cells = []
        for entry, guarantees, outcomes in rows:
            level = guarantees.get(name, {}).get("level", "?")
            ran = [outcomes.get(t) for t in tests]
            ok = sum(1 for r in ran if r == "ok")
            failed = sum(1 for r in ran if r == "FAILED")
            if ok == len(tests):
                cells.append("%s ✓ %d/%d" % (level, ok, len(tests)))
            elif failed:
                cells.append("%s ✗ %d/%d (%d failed)" % (level, ok, len(tests), failed))
            else:
                cells.append("%s – %d/%d (%d did not run)" % (level, ok, len(tests), len(tests) - ok))
        lines.append("| %s | %s |" % (name, " | ".join(cells)))
    known = set().union(*(outcomes for _, _, outcomes in rows))
    missing = [t for tests in BACKING.values() for t in tests if t not in known]
    lines += ["", "How each guest enforced it (its outcome's `how`):", ""]
    for name in BACKING:
        hows = []
        for entry, guarantees, _ in rows:
            hows.append("%s: %s" % (entry, guarantees.get(name, {}).get("how", "?")))
        lines.append("- **%s**: %s" % (name, "; ".join(hows)))
    lines += ["", "## The tests behind each row", ""]
    for name, tests in BACKING.items():
        lines.append("- **%s**: %s" % (name, ", ".join("`%s`" % t for t in tests)))
    lines.append("")
    if missing:
        sys.exit("vm-report: tests named in BACKING ran in no guest (renamed?):\n  " + "\n  ".join(missing))
    with open(out, "w") as f:
        f.write("\n".join(lines))
    print("vm-report: wrote %s (%s)" % (out, ", ".join(entries)))


if __name__ == "__main__":
    main()
