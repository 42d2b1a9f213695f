"""A soak of `confine serve` through the official MCP Python SDK.

Run by tests/suite/soak.rs inside target/mcp-venv:

    python soak.py URL --token T --jobs N --workers 4 --marker M [--checkpoint-dir D --marks A,B,C]

N jobs, back to back on each of `workers` sessions at once, of eight
kinds in turn: success, failure, timeout, OOM, an output flood, a
background job killed, a call cancelled mid-run, a request the policy
denies. Each job checks its own answer. With `--checkpoint-dir D --marks
A,B,C`, every worker stops after A, B and C jobs until the caller, told by
`D/checkpoint-<k>`, has measured the idle server and created `D/ack-<k>`.
Prints one JSON line at the end: how many
jobs of each kind, and how many runtime_execute calls were made (each
one is an audit record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

KINDS = ["success", "failure", "timeout", "oom", "flood", "background_killed", "cancelled", "denied"]


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def sc(r) -> dict:
    """The answer's structured content; a tool error is a failure, with its text."""
    if r.structured_content is None:
        raise AssertionError("a tool error: " + " ".join(getattr(c, "text", "") for c in r.content))
    return r.structured_content


async def job(client: Client, i: int, marker: str) -> int:
    """Run job `i`; returns how many runtime_execute calls it made."""
    kind = KINDS[i % len(KINDS)]
    call = lambda args: client.call_tool("runtime_execute", {"repoId": "demo", "runtime": "shell", **args})
    if kind == "success":
        r = await call({"code": f"echo {marker}-{i}"})
        s = sc(r)
        check(s["status"] == "success" and f"{marker}-{i}" in s["stdout"], f"{kind}: {s}")
    elif kind == "failure":
        r = await call({"code": "echo no >&2; exit 3"})
        s = sc(r)
        check(s["status"] == "failure" and s["exitCode"] == 3, f"{kind}: {s}")
    elif kind == "timeout":
        r = await call({"code": f"sleep 30 # {marker}", "timeoutMs": 500})
        check(sc(r)["status"] == "timeout", f"{kind}: {sc(r)}")
    elif kind == "oom":
        # The server's [limits] memory_bytes is 64 MiB.
        r = await client.call_tool(
            "runtime_execute", {"repoId": "demo", "runtime": "python", "code": "b = bytearray(256 << 20)"}
        )
        check(sc(r)["status"] == "oom", f"{kind}: {sc(r)}")
    elif kind == "flood":
        r = await call({"code": "head -c 4000000 /dev/zero | tr '\\0' x; echo; seq 1 50000"})
        s = sc(r)
        check(s["status"] == "success" and s.get("artifactHandle"), f"{kind}: {s}")
    elif kind == "background_killed":
        r = await call({"code": f"echo up; sleep 60 # {marker}", "background": True})
        check(sc(r)["status"] == "running", f"{kind}: {sc(r)}")
        await anyio.sleep(0.1)
        k = await client.call_tool("runtime_kill", {"jobId": sc(r)["jobId"]})
        check(sc(k)["status"] in ("killed", "cancelled"), f"{kind}: kill: {sc(k)}")
    elif kind == "cancelled":
        with anyio.move_on_after(0.5) as scope:
            await call({"code": f"sleep 30 # {marker}"})
        check(scope.cancelled_caught, f"{kind}: the call returned early")
    elif kind == "denied":
        r = await call({"code": "true", "network": {"allow": ["example.com"]}})
        check(sc(r)["status"] == "denied", f"{kind}: {sc(r)}")
    return 1


class Checkpoints:
    """Marks (job counts) where every worker stops and waits: the caller
    measures the idle server (the file `<dir>/checkpoint-<k>` says it may),
    then lets them go on (it creates `<dir>/ack-<k>`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dir, self.workers = args.checkpoint_dir, args.workers
        self.marks = sorted({int(m) for m in args.marks.split(",") if 0 < int(m) < args.jobs}) if args.marks else []
        self.arrived = {m: 0 for m in self.marks}
        self.go = {m: anyio.Event() for m in self.marks}

    async def reached(self, mark: int) -> None:
        if not self.dir or mark not in self.arrived:
            return
        self.arrived[mark] += 1
        if self.arrived[mark] == self.workers:
            k = self.marks.index(mark) + 1
            with open(f"{self.dir}/checkpoint-{k}", "w") as f:
                f.write(str(mark))
            while not os.path.exists(f"{self.dir}/ack-{k}"):
                await anyio.sleep(0.05)
            self.go[mark].set()
        await self.go[mark].wait()


async def worker(args: argparse.Namespace, w: int, done: list[int], calls: list[int], cp: Checkpoints) -> None:
    headers = {"Authorization": f"Bearer {args.token}"}
    transport = streamable_http_client(args.url, http_client=create_mcp_http_client(headers=headers))
    async with Client(transport) as client:
        mine = list(range(w, args.jobs, args.workers))
        for i in mine:
            # Each worker stops before its first job past a mark.
            for mark in cp.marks:
                if i >= mark and i - args.workers < mark:
                    await cp.reached(mark)
            n = await job(client, i, args.marker)
            calls[0] += n
            done[0] += 1
            if done[0] % max(1, args.jobs // 20) == 0:
                print(f"soak: {done[0]}/{args.jobs} jobs", file=sys.stderr, flush=True)
        # A worker with no job past a mark still arrives there.
        for mark in cp.marks:
            if not any(i >= mark for i in mine):
                await cp.reached(mark)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--token", required=True)
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--marker", required=True, help="a word every job's command line carries")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--marks", help="job counts to stop at, comma-separated")
    args = p.parse_args()
    done, calls = [0], [0]
    cp = Checkpoints(args)
    async with anyio.create_task_group() as tg:
        for w in range(args.workers):
            tg.start_soon(worker, args, w, done, calls, cp)
    kinds = {k: len(range(i, args.jobs, len(KINDS))) for i, k in enumerate(KINDS)}
    print(json.dumps({"jobs": done[0], "executeCalls": calls[0], "kinds": kinds}), flush=True)


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
