"""Warm sandboxes at a real MCP client: latency and throughput.

Run by benches/warm.sh, which starts two `confine serve --http` on fresh
copies of the release binary, one with `[sandbox] warm = 2` (the
default) and one with `warm = 0`, and passes their URLs. Measured in one
run, interleaved round by round, each round's rows in an order drawn
from a seeded generator (`--seed`; the output names it):

- a governed `runtime_execute` (shell, code `true`) on each server;
- the transport's floor: an MCP ping, which the server answers at once;
- the client's floor for a tool call: `usage_stats` of the session, which
  the server answers from counters in memory (no store, no job), but
  which the client validates against the tool's output schema as it does
  `runtime_execute`'s answer;
- `bwrap --unshare-all ... /bin/true` and plain `/bin/true`, each
  started with posix_spawn and waited for, from this same process.

Then throughput: 4 workers at once for a few seconds on each server, for
bwrap, and for the ping and the cheap tool call (the client's own
ceilings), in turn, three times, each time in a drawn order. Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
    p.add_argument("--seed", type=int, default=None, help="the rows' order generator's seed (default: drawn)")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
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
        # What follows what matters (the host's state after the step
        # before): each round runs its rows in an order of its own, drawn
        # from a seeded generator whose seed the output names.
        rng = random.Random(args.seed)

        async def warm_row() -> tuple[float, dict]:
            return await timed(warm, "runtime_execute", call)

        async def cold_row() -> tuple[float, dict]:
            return await timed(cold, "runtime_execute", call)

        async def ping_row() -> tuple[float, dict]:
            return await ping(warm), {}

        async def tool_row() -> tuple[float, dict]:
            return await timed(warm, "usage_stats", cheap)

        async def bwrap_row() -> tuple[float, dict]:
            return spawn_wait(BWRAP), {}

        async def plain_row() -> tuple[float, dict]:
            return spawn_wait(["/bin/true"]), {}

        rows = {"warm": warm_row, "cold": cold_row, "ping": ping_row, "tool": tool_row, "bwrap": bwrap_row, "plain": plain_row}
        lat = {k: [] for k in rows}
        warm_hits = 0
        for i in range(args.rounds + 10):
            order = list(rows)
            rng.shuffle(order)
            took = {}
            for name in order:
                took[name] = await rows[name]()
            if i < 10:
                continue
            warm_hits += bool((took["warm"][1].get("layers") or {}).get("warm"))
            for k, (v, _) in took.items():
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
        # Each repetition in an order of its own, as the rounds above.
        orders = []
        for _ in range(3):
            order = list(bursts)
            rng.shuffle(order)
            orders.append(order)
            for name in order:
                tput[name].append(await burst(bursts[name], args.seconds))

    out = {"second": args.second, "seed": args.seed, "burstOrders": orders}
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
