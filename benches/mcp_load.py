"""Load on `confine serve --http`: N concurrent runtime_execute calls.

Run by benches/mcp_load.sh (which starts the server with max_concurrent_jobs
= 4 and its own store). Each call runs `sleep 0.05; echo ok` in the shell
runtime through the whole governed pipeline. Prints calls/s, p50/p99
latency, and how many calls ran, were refused as busy, or failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--token", help="bearer token (the server always requires one)")
    args = p.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    lat: list[float] = []
    counts = {"success": 0, "busy": 0, "other": 0}
    transport = streamable_http_client(args.url, http_client=create_mcp_http_client(headers=headers))
    async with Client(transport, mode="legacy") as client:
        async def one() -> None:
            t = time.monotonic()
            r = await client.call_tool(
                "runtime_execute", {"repoId": "load", "runtime": "shell", "code": "sleep 0.05; echo ok"}
            )
            lat.append(time.monotonic() - t)
            text = "\n".join(c.text for c in r.content if getattr(c, "type", None) == "text")
            if not r.is_error and (r.structured_content or {}).get("status") == "success":
                counts["success"] += 1
            elif text.startswith("busy:"):
                counts["busy"] += 1
            else:
                counts["other"] += 1
                print("unexpected:", text[:200])

        started = time.monotonic()
        with anyio.fail_after(300):
            async with anyio.create_task_group() as tg:
                for _ in range(args.calls):
                    tg.start_soon(one)
        wall = time.monotonic() - started
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(json.dumps({
        "calls": args.calls,
        "answered": len(lat),
        "wallSeconds": round(wall, 2),
        "callsPerSecond": round(len(lat) / wall, 1),
        "p50Ms": round(statistics.median(lat) * 1000, 1),
        "p99Ms": round(p99 * 1000, 1),
        **counts,
    }))


if __name__ == "__main__":
    anyio.run(main)
