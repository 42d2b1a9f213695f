"""Warm sandboxes at a real MCP client: latency and throughput.

Run by benches/warm.sh, which starts two `confine serve --http` on fresh
copies of the release binary, one with `[sandbox] warm = 2` (the
default) and one with `warm = 0`, and passes their URLs. Measured in one
run, interleaved round by round:

- a governed `runtime_execute` (shell, code `true`) on each server,
  each called first on every other round;
- the transport's floor: an MCP ping, which the server answers at once;
- the client's floor for a tool call: `usage_stats` of the session, which
  the server answers from counters in memory (no store, no job), but
  which the client validates against the tool's output schema as it does
  `runtime_execute`'s answer;
- `bwrap --unshare-all ... /bin/true` and plain `/bin/true`, each
  started with posix_spawn and waited for, from this same process.

Then throughput: 4 workers at once for a few seconds on each server, for
bwrap, and for the ping and the cheap tool call (the client's own
ceilings), in turn, three times, the order turned by one each time. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BWRAP = [
    "bwrap", "--unshare-all", "--die-with-parent",
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
    "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    "/bin/true",
]


def spawn_wait(argv: list[str]) -> float:
    t = time.perf_counter()
    pid = os.posix_spawnp(argv[0], argv, {})
    _, status = os.waitpid(pid, 0)
    took = time.perf_counter() - t
    if status != 0:
        raise RuntimeError(f"{argv[0]} exited with {status}")
    return took


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round((len(s) - 1) * p))]


def row(xs: list[float]) -> dict:
    return {"p50Ms": round(pct(xs, 0.5) * 1000, 2), "p90Ms": round(pct(xs, 0.9) * 1000, 2), "n": len(xs)}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("warm_url")
    p.add_argument("cold_url")
    p.add_argument("--token", required=True)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--second", default="cold", help="what the second server is, for the output")
    args = p.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"}
    call = {"repoId": "bench", "runtime": "shell", "code": "true", "verbose": True}

    def client(url: str) -> Client:
        return Client(streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)), mode="legacy")

    async with client(args.warm_url) as warm, client(args.cold_url) as cold:
        async def timed(c: Client, tool: str, a: dict) -> tuple[float, dict]:
            t = time.perf_counter()
            r = await c.call_tool(tool, a)
            took = time.perf_counter() - t
            sc = r.structured_content or {}
            if r.is_error or (tool == "runtime_execute" and sc.get("status") != "success"):
                raise RuntimeError(f"{tool}: {r.content}")
            return took, sc

        async def ping(c: Client) -> float:
            t = time.perf_counter()
            await c.send_ping()
            return time.perf_counter() - t

        cheap = {"scope": "session"}
        lat = {k: [] for k in ["warm", "cold", "ping", "tool", "bwrap", "plain"]}
        warm_hits = 0
        for i in range(args.rounds + 10):
            # Each server called first on every other round.
            if i % 2:
                c, _ = await timed(cold, "runtime_execute", call)
                w, sc = await timed(warm, "runtime_execute", call)
            else:
                w, sc = await timed(warm, "runtime_execute", call)
                c, _ = await timed(cold, "runtime_execute", call)
            n = await ping(warm)
            u, _ = await timed(warm, "usage_stats", cheap)
            b = spawn_wait(BWRAP)
            f = spawn_wait(["/bin/true"])
            if i < 10:
                continue
            warm_hits += bool((sc.get("layers") or {}).get("warm"))
            for k, v in zip(["warm", "cold", "ping", "tool", "bwrap", "plain"], [w, c, n, u, b, f]):
                lat[k].append(v)

        async def burst(fn, seconds: float) -> float:
            done = 0
            end = time.perf_counter() + seconds

            async def worker() -> None:
                nonlocal done
                while time.perf_counter() < end:
                    await fn()
                    done += 1

            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(worker)
            return done / (time.perf_counter() - t)

        async def bwrap_once() -> None:
            await anyio.to_thread.run_sync(spawn_wait, BWRAP)

        # The ping's rate is the client's and transport's ceiling: no
        # request's rate at this client can exceed it.
        tput = {"warm": [], "cold": [], "bwrap": [], "ping": [], "tool": []}
        hits = {"warm": 0, "all": 0}

        async def warm_call() -> None:
            _, sc = await timed(warm, "runtime_execute", call)
            hits["all"] += 1
            hits["warm"] += bool((sc.get("layers") or {}).get("warm"))

        bursts = {
            "warm": warm_call,
            "bwrap": bwrap_once,
            "cold": lambda: timed(cold, "runtime_execute", call),
            "ping": lambda: ping(warm),
            "tool": lambda: timed(warm, "usage_stats", cheap),
        }
        # The order turns each repetition: a burst's place in the sequence
        # (the host's state after the burst before it) is worth several
        # percent, which a fixed order would give one server every time.
        order = list(bursts)
        for rep in range(3):
            for name in order[rep:] + order[:rep]:
                tput[name].append(await burst(bursts[name], args.seconds))

    out = {"second": args.second}
    out.update({k: row(v) for k, v in lat.items()})
    out["warmHits"] = f"{warm_hits}/{args.rounds}"
    b50 = pct(lat["bwrap"], 0.5)
    out["ratios"] = {
        "warmOverBwrap": round(pct(lat["warm"], 0.5) / b50, 2),
        "coldOverBwrap": round(pct(lat["cold"], 0.5) / b50, 2),
        "pingOverBwrap": round(pct(lat["ping"], 0.5) / b50, 2),
        "toolOverBwrap": round(pct(lat["tool"], 0.5) / b50, 2),
        "warmMinusPingOverBwrap": round((pct(lat["warm"], 0.5) - pct(lat["ping"], 0.5)) / b50, 2),
        "coldMinusPingOverBwrap": round((pct(lat["cold"], 0.5) - pct(lat["ping"], 0.5)) / b50, 2),
    }
    out["jobsPerSecond4"] = {k: [round(x, 1) for x in v] for k, v in tput.items()}
    out["warmHits4"] = f"{hits['warm']}/{hits['all']}"
    out["throughputRatios"] = {
        "warmOverBwrap": round(statistics.median(tput["warm"]) / statistics.median(tput["bwrap"]), 2),
        "coldOverBwrap": round(statistics.median(tput["cold"]) / statistics.median(tput["bwrap"]), 2),
        "pingOverBwrap": round(statistics.median(tput["ping"]) / statistics.median(tput["bwrap"]), 2),
        "toolOverBwrap": round(statistics.median(tput["tool"]) / statistics.median(tput["bwrap"]), 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main)
