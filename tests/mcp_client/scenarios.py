"""End-to-end scenarios for `confine serve`, driven by the official MCP Python SDK.

Run by tests/mcp_e2e.rs inside target/mcp-venv:

    python scenarios.py stdio /path/to/confine [--mode auto|legacy]
    python scenarios.py http http://127.0.0.1:PORT/mcp [--token T] [--mode auto|legacy]

`--mode auto` lets the SDK negotiate the newest protocol (server/discover);
`legacy` forces the initialize handshake that most deployed clients use.
Prints one `ok <scenario>` line per scenario; any failure raises (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import anyio
import jsonschema
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {"info", "runtime_execute", "runtime_jobs", "runtime_kill", "runtime_query_output", "usage_stats"}


def text(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


async def list_tools(client: Client) -> None:
    tools = (await client.list_tools()).tools
    names = {t.name for t in tools}
    check(TOOLS <= names, f"tools: {sorted(names)}")
    for t in tools:
        check(t.input_schema.get("type") == "object", f"{t.name} input schema: {t.input_schema}")
        # Lean listing (src/mcp/schema.rs): no output schema, no non-standard formats.
        check(t.output_schema is None, f"{t.name} has an output schema")
        check('"format"' not in json.dumps(t.input_schema), f"{t.name} uses a format: {t.input_schema}")
        # A valid JSON Schema, to a real validator (the SDK's own dependency).
        jsonschema.validators.validator_for(t.input_schema).check_schema(t.input_schema)
    exec_tool = next(t for t in tools if t.name == "runtime_execute")
    schema = exec_tool.input_schema
    v = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    good = {"repoId": "demo", "runtime": "shell", "code": "echo hi", "timeoutMs": 5000, "outputMode": "minimal"}
    check(v.is_valid(good), f"a good call fails the schema: {list(v.iter_errors(good))}")
    for bad in ({"runtime": "shell", "timeoutMs": "5000"}, {"runtime": "shell", "timeoutMs": -1}, {"code": "x"}):
        check(not v.is_valid(bad), f"the schema takes {bad}")
    props = exec_tool.input_schema["properties"]
    for p in ("repoId", "runtime", "code", "args", "timeoutMs", "queryTerms", "outputMode", "background"):
        check(p in props, f"runtime_execute lacks {p}")


async def execute_and_query(client: Client) -> None:
    r = await client.call_tool("runtime_execute", {"repoId": "demo", "runtime": "shell", "code": "echo hi"})
    check(not r.is_error, f"execute failed: {text(r)}")
    out = r.structured_content
    check(out["status"] == "success" and out["exitCode"] == 0, f"execute: {out}")
    # A small output is in the answer, and the text is a short rendering.
    check(out.get("stdout") == "hi", f"inline output: {out}")
    check(text(r).startswith("success exit=0 ") and text(r).endswith("\nhi"), f"text: {text(r)!r}")
    q = await client.call_tool(
        "runtime_query_output", {"artifactHandle": out["artifactHandle"], "queryTerms": ["hi"], "contextLines": 0}
    )
    check(not q.is_error, f"query failed: {text(q)}")
    check(q.structured_content["excerpts"][0]["content"] == "hi", f"query: {q.structured_content}")


async def bad_calls(client: Client) -> None:
    cases = [
        ({"repoId": "d", "runtime": "shell", "code": "x", "timeoutMs": 5}, "invalid: timeoutMs must be between"),
        ({"repoId": "d", "runtime": "shell", "code": "x", "args": ["y"]}, "invalid: give either code or args"),
        ({"runtime": "shell", "code": "x"}, "invalid: repoId: name the workspace"),
        ({"repoId": "d", "runtime": "cobol", "code": "x"}, "invalid: unknown runtime"),
    ]
    for args, want in cases:
        r = await client.call_tool("runtime_execute", args)
        check(r.is_error, f"{args} was not an error")
        check(text(r).startswith(want), f"{args}: {text(r)!r}")
        check("\n" not in text(r), f"not one line: {text(r)!r}")
    r = await client.call_tool(
        "runtime_execute", {"repoId": "d", "runtime": "shell", "executable": "curl", "args": ["http://example.org"]}
    )
    check(r.is_error and r.structured_content["status"] == "denied", f"denial: {text(r)}")
    check("denied by policy: 'curl' is a network tool" in r.structured_content.get("error", ""), f"denial: {text(r)}")


async def background_then_kill(client: Client) -> None:
    r = await client.call_tool(
        "runtime_execute", {"repoId": "d", "runtime": "shell", "code": "echo up; sleep 60", "background": True}
    )
    check(r.structured_content["status"] == "running", f"background: {r.structured_content}")
    job = r.structured_content["jobId"]
    await anyio.sleep(0.3)
    jobs = await client.call_tool("runtime_jobs", {"jobId": job})
    check(jobs.structured_content["jobs"][0]["status"] == "running", f"jobs: {jobs.structured_content}")
    check(jobs.structured_content["output"]["text"] == "up\n", f"jobs output: {jobs.structured_content}")
    # Another job: `runtime_jobs {jobId}` lists the one asked for only.
    other = await client.call_tool("runtime_execute", {"repoId": "d", "runtime": "shell", "code": "true", "background": True})
    jobs = await client.call_tool("runtime_jobs", {"jobId": job})
    listed = [j["jobId"] for j in jobs.structured_content["jobs"]]
    check(listed == [job], f"runtime_jobs {{jobId}} listed {listed}, not only {job} (other: {other.structured_content})")
    k = await client.call_tool("runtime_kill", {"jobId": job})
    check(k.structured_content["status"] == "killed", f"kill: {k.structured_content}")
    # A kill is no failure of the sandbox: no internal error in the answer.
    check("error" not in k.structured_content, f"kill answer carries an error: {k.structured_content}")
    # runtime_jobs agrees with the kill's answer.
    jobs = await client.call_tool("runtime_jobs", {"jobId": job})
    check(jobs.structured_content["jobs"][0]["status"] == "killed", f"jobs after kill: {jobs.structured_content}")


async def cancelled_status_count(client: Client) -> int:
    u = await client.call_tool("usage_stats", {"scope": "session"})
    return u.structured_content["session"]["statuses"].get("cancelled", 0)


async def cancel_by_notification(client: Client) -> None:
    before = await cancelled_status_count(client)
    # Abandoning the call makes the SDK send notifications/cancelled (or, on
    # the 2026 HTTP wire, close the request's stream, which is its spelling).
    with anyio.move_on_after(1.0) as scope:
        await client.call_tool("runtime_execute", {"repoId": "d", "runtime": "shell", "code": "sleep 30"})
    check(scope.cancelled_caught, "the 30 s call returned early")
    deadline = time.monotonic() + 8
    while await cancelled_status_count(client) <= before:
        check(time.monotonic() < deadline, "the server did not cancel the call")
        await anyio.sleep(0.1)
    jobs = await client.call_tool("runtime_jobs", {})
    statuses = [j["status"] for j in jobs.structured_content["jobs"]]
    check("cancelled" in statuses, f"no cancelled job: {statuses}")


async def progress(client: Client) -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    r = await client.call_tool(
        "runtime_execute",
        {"repoId": "d", "runtime": "shell", "code": "echo go; sleep 3"},
        progress_callback=on_progress,
    )
    check(r.structured_content["status"] == "success", f"progress job: {r.structured_content}")
    check(len(seen) >= 2, f"progress notifications: {seen}")
    check(all(b[0] > a[0] for a, b in zip(seen, seen[1:])), f"progress must grow: {seen}")
    check("bytes of output" in (seen[-1][1] or ""), f"progress message: {seen[-1]}")


SCENARIOS = [list_tools, execute_and_query, bad_calls, background_then_kill, cancel_by_notification, progress]


def client_for(args: argparse.Namespace) -> Client:
    if args.transport == "stdio":
        cfg = ["--config", args.config] if args.config else []
        params = StdioServerParameters(command=args.target, args=[*cfg, "serve"], env={"CONFINE_LOG": "warn"})
        return Client(params, mode=args.mode)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    transport = streamable_http_client(args.target, http_client=create_mcp_http_client(headers=headers))
    return Client(transport, mode=args.mode)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("transport", choices=["stdio", "http"])
    p.add_argument("target", help="confine binary (stdio) or endpoint URL (http)")
    p.add_argument("--token")
    p.add_argument("--config", help="confine.toml for the stdio server")
    p.add_argument("--mode", default="auto", choices=["auto", "legacy"])
    args = p.parse_args()
    async with client_for(args) as client:
        print(f"protocol {client.protocol_version}", flush=True)
        for scenario in SCENARIOS:
            started = time.monotonic()
            await scenario(client)
            print(f"ok {scenario.__name__} ({time.monotonic() - started:.1f}s)", flush=True)


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
