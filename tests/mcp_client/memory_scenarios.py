"""Memory and feedback tools of `confine serve`, driven by the official MCP Python SDK.

Run by tests/mcp_memory_e2e.rs inside target/mcp-venv:

    python memory_scenarios.py /path/to/confine --config confine.toml --repo-root /path/to/repo [--mode auto|legacy]

The config must name one repository `demo` whose root is --repo-root and which
holds src/auth.rs. Prints one `ok <scenario>` line per scenario; any failure
raises (exit 1).
"""

from __future__ import annotations

import argparse
import os
import time

import anyio
import jsonschema
from mcp import Client, StdioServerParameters

MEMORY_TOOLS = {
    "memory_store",
    "memory_query",
    "memory_remove",
    "memory_surface",
    "agent_feedback",
    "agent_feedback_query",
}
REPO = "demo"
ROOT = ""


def text(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def ok(result) -> dict:
    check(not result.is_error, f"tool error: {text(result)}")
    return result.structured_content


def memory_files() -> dict[str, bytes]:
    d = os.path.join(ROOT, ".confine-memory")
    if not os.path.isdir(d):
        return {}
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


async def list_memory_tools(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    check(MEMORY_TOOLS <= set(tools), f"tools: {sorted(tools)}")
    for name in MEMORY_TOOLS:
        t = tools[name]
        check(t.input_schema.get("type") == "object", f"{name} input schema: {t.input_schema}")
        check(t.output_schema is None, f"{name} has an output schema (the listing is lean)")
        check('"format"' not in str(t.input_schema), f"{name} uses a format: {t.input_schema}")
        jsonschema.validators.validator_for(t.input_schema).check_schema(t.input_schema)
    props = tools["memory_store"].input_schema["properties"]
    for p in ("repoId", "type", "title", "content", "tags", "confidence", "symbolIds", "fileRelPaths", "memoryId"):
        check(p in props, f"memory_store lacks {p}")
    for p in ("query", "types", "tags", "symbolIds", "staleOnly", "limit", "sortBy"):
        check(p in tools["memory_query"].input_schema["properties"], f"memory_query lacks {p}")


async def store_query_surface_remove(client: Client) -> None:
    memory = {
        "repoId": REPO,
        "type": "bugfix",
        "title": "Race in authenticate()",
        "content": "The token refresh promise was not awaited, so concurrent requests failed.",
        "tags": ["auth", "concurrency"],
        "confidence": 0.9,
        "symbolIds": ["sym:authenticate"],
        "fileRelPaths": ["src/auth.rs"],
    }
    stored = ok(await client.call_tool("memory_store", memory))
    check(stored["created"] and not stored["deduplicated"], f"store: {stored}")
    mid = stored["memoryId"]
    check(f"{mid}.md" in memory_files(), f"no markdown mirror: {list(memory_files())}")
    again = ok(await client.call_tool("memory_store", memory))
    check(again == {"ok": True, "memoryId": mid, "created": False, "deduplicated": True}, f"dedup: {again}")

    q = ok(await client.call_tool("memory_query", {"repoId": REPO, "query": "concurrent token", "limit": 5}))
    check(q["total"] == 1 and q["memories"][0]["memoryId"] == mid, f"query: {q}")
    check(q["memories"][0]["fileRelPaths"] == ["src/auth.rs"], f"query: {q}")

    s = ok(
        await client.call_tool(
            "memory_surface", {"repoId": REPO, "symbolIds": ["sym:authenticate"], "fileRelPaths": ["src/auth.rs"]}
        )
    )
    top = s["memories"][0]
    check(top["memoryId"] == mid and top["matchedSymbols"] == ["sym:authenticate"], f"surface: {s}")
    check(abs(top["score"] - 0.9) < 0.01, f"score of a fresh exact match at 0.9: {top}")

    r = ok(await client.call_tool("memory_remove", {"repoId": REPO, "memoryId": mid, "deleteFile": True}))
    check(r == {"ok": True, "memoryId": mid, "fileDeleted": True}, f"remove: {r}")
    check(f"{mid}.md" not in memory_files(), "the file was not deleted")
    q = ok(await client.call_tool("memory_query", {"repoId": REPO, "query": "token"}))
    check(q["total"] == 0 and q["memories"] == [], f"removed memory still found: {q}")


async def upsert(client: Client) -> None:
    base = {"repoId": REPO, "type": "decision", "title": "Cache TTL", "content": "Five minutes."}
    mid = ok(await client.call_tool("memory_store", base))["memoryId"]
    up = ok(await client.call_tool("memory_store", {**base, "content": "Ten minutes.", "memoryId": mid}))
    check(up == {"ok": True, "memoryId": mid, "created": False, "deduplicated": False}, f"upsert: {up}")
    q = ok(await client.call_tool("memory_query", {"repoId": REPO, "types": ["decision"]}))
    check([m["content"] for m in q["memories"]] == ["Ten minutes."], f"after upsert: {q}")


async def stale_and_info(client: Client) -> None:
    info = ok(await client.call_tool("info", {"repoId": REPO}))
    check(info.get("staleMemories") == 0, f"info: {info.get('staleMemories')}")
    mid = ok(
        await client.call_tool(
            "memory_store",
            {"repoId": REPO, "type": "task_context", "title": "Linked", "content": "x", "fileRelPaths": ["src/auth.rs"]},
        )
    )["memoryId"]
    with open(os.path.join(ROOT, "src/auth.rs"), "a") as f:
        f.write("// edited\n")
    info = ok(await client.call_tool("info", {"repoId": REPO}))
    check(info.get("staleMemories") == 1, f"info after the edit: {info.get('staleMemories')}")
    q = ok(await client.call_tool("memory_query", {"repoId": REPO, "staleOnly": True}))
    check([m["memoryId"] for m in q["memories"]] == [mid], f"staleOnly: {q}")
    check(q["memories"][0]["stale"] and q["memories"][0]["staleFiles"] == ["src/auth.rs"], f"stale: {q}")


async def bad_input(client: Client) -> None:
    before_files = memory_files()
    before = ok(await client.call_tool("memory_query", {"repoId": REPO, "limit": 100}))["total"]
    base = {"repoId": REPO, "type": "bugfix", "title": "t", "content": "c"}
    cases = [
        ({**base, "title": "x" * 121}, "invalid: title is 121 characters; at most 120"),
        ({**base, "tags": [f"t{i}" for i in range(21)]}, "invalid: at most 20 tags (got 21)"),
        ({**base, "confidence": 1.5}, "invalid: confidence must be between 0 and 1 (got 1.5)"),
        ({**base, "fileRelPaths": ["../../etc/passwd"]}, "invalid: fileRelPath '../../etc/passwd' contains '..'"),
        ({**base, "memoryId": "mem_doesnotexist"}, "not_found: unknown memoryId 'mem_doesnotexist'"),
    ]
    for args, want in cases:
        r = await client.call_tool("memory_store", args)
        check(r.is_error, f"{args} was not an error")
        check(text(r).startswith(want), f"{args}: {text(r)!r}")
        check("\n" not in text(r), f"not one line: {text(r)!r}")
    r = await client.call_tool("memory_remove", {"repoId": REPO, "memoryId": "mem_doesnotexist"})
    check(r.is_error and text(r).startswith("not_found: unknown memoryId"), f"remove unknown: {text(r)}")
    check(memory_files() == before_files, "a refused call changed .confine-memory")
    after = ok(await client.call_tool("memory_query", {"repoId": REPO, "limit": 100}))["total"]
    check(after == before, f"a refused call stored something: {before} -> {after}")


async def feedback(client: Client) -> None:
    # Feedback names what confine returned: here a memory it stored.
    mem = ok(
        await client.call_tool(
            "memory_store",
            {"repoId": REPO, "type": "bugfix", "title": "Token expiry", "content": "The refresh was not awaited."},
        )
    )["memoryId"]
    r = ok(
        await client.call_tool(
            "agent_feedback",
            {
                "repoId": REPO,
                "usefulHandles": [mem],
                "missing": ["the auth service's log"],
                "ids": ["v1"],
                "taskType": "debug",
                "taskText": "traced auth timeout to token expiry logic",
            },
        )
    )
    check(r["recorded"] == 2 and r["feedbackId"], f"feedback: {r}")
    q = ok(await client.call_tool("agent_feedback_query", {"repoId": REPO, "handle": "v1", "limit": 10}))
    stats = q["aggregatedStats"]
    check(stats["totalFeedback"] == 1 and not q["hasMore"], f"feedback query: {q}")
    check(stats["topUseful"] == [{"name": mem, "count": 1}], f"{stats}")
    r = await client.call_tool("agent_feedback", {"repoId": REPO, "usefulHandles": []})
    check(r.is_error and text(r).startswith("invalid: usefulHandles needs at least 1"), f"empty useful: {text(r)}")
    r = await client.call_tool("agent_feedback", {"repoId": REPO, "usefulHandles": ["h_abc"]})
    check(r.is_error and "is not a handle confine returned" in text(r), f"foreign handle: {text(r)}")


SCENARIOS = [list_memory_tools, store_query_surface_remove, upsert, stale_and_info, bad_input, feedback]


async def main() -> None:
    global ROOT
    p = argparse.ArgumentParser()
    p.add_argument("target", help="the confine binary")
    p.add_argument("--config", required=True)
    p.add_argument("--repo-root", required=True)
    p.add_argument("--mode", default="auto", choices=["auto", "legacy"])
    args = p.parse_args()
    ROOT = args.repo_root
    params = StdioServerParameters(
        command=args.target, args=["--config", args.config, "serve"], env={"CONFINE_LOG": "warn"}
    )
    async with Client(params, mode=args.mode) as client:
        for scenario in SCENARIOS:
            started = time.monotonic()
            await scenario(client)
            print(f"ok {scenario.__name__} ({time.monotonic() - started:.1f}s)", flush=True)


if __name__ == "__main__":
    anyio.run(main)
