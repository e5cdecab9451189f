"""An agent's session with `gantry mcp`, through the official MCP Python SDK (`mcp<2`), as a real user.

    python mcp_agent.py owner GANTRY STATE_DIR IMAGE      # exits 0 when every step behaved; last line RESULT {...}
    python mcp_agent.py intruder GANTRY STATE_DIR LOG_JOB CANCEL_JOB BOOKING

`owner`: initialize, list the tools (schemas and annotations), the queue and GPUs; submit a job and read
its finished log (last lines, a pattern); preview a job (nothing queued) then submit and cancel it; triage
a failed one; compare two runs; history; book GPUs (a booking over the lab's rules is refused with the
engine's words), cancel one of its bookings; then leaves a running job and a booking for `intruder`.
`intruder` (another user): reading the owner's log, cancelling the owner's job and the owner's booking
are refused (tool errors).
Prints each call and a short answer: the transcript in docs/book/src/agents.md is this output.
Run by tests/mcp.rs with the venv of scripts/mcp-venv.sh.
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# How long a job of busybox may take to end on a loaded CI machine.
DEADLINE_S = 180


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


def brief(v, n=300):
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) <= n else s[: n - 1] + "…"


async def call(s, name, args=None, refused=False, quiet=False):
    args = args or {}
    print(f"→ {name} {json.dumps(args)}")
    r = await s.call_tool(name, args)
    if r.isError:
        text = r.content[0].text if r.content else ""
        print(f"← tool error: {text}")
        check(refused, f"{name} failed: {text}")
        return text
    check(not refused, f"{name} was not refused: {r.structuredContent}")
    out = r.structuredContent
    check(out is not None, f"{name} gave no structured content")
    if not quiet:
        print(f"← {brief(out)}")
    return out


async def wait_state(s, job, states):
    t = time.monotonic()
    while True:
        d = (await s.call_tool("show_job", {"id": job})).structuredContent
        if d["state"] in states:
            print(f"  (job {job} is {d['state']})")
            return d
        check(time.monotonic() - t < DEADLINE_S, f"job {job} stayed {d['state']}, not {states}")
        await asyncio.sleep(0.5)


def server(gantry, state):
    env = {k: os.environ[k] for k in ("HOME", "USER", "PATH") if k in os.environ}
    return StdioServerParameters(command=gantry, args=["--state-dir", state, "mcp"], env=env)


EXPECTED = {
    # name: (readOnlyHint, destructiveHint)
    "list_jobs": (True, None),
    "job_history": (True, None),
    "show_job": (True, None),
    "read_log": (True, None),
    "gpus": (True, None),
    "why_waiting": (True, None),
    "compare_jobs": (True, None),
    "triage_job": (True, None),
    "preview_submit": (True, None),
    "submit_job": (False, False),
    "cancel_job": (False, True),
    "hold_job": (False, False),
    "release_job": (False, False),
    "rerun_job": (False, False),
    "list_bookings": (True, None),
    "book_gpus": (False, False),
    "cancel_booking": (False, True),
}


async def owner(gantry, state, image):
    async with stdio_client(server(gantry, state)) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            print(f"initialized: {init.serverInfo.name} {init.serverInfo.version}")
            check(init.serverInfo.name == "gantry", "server name")
            check("preview_submit" in (init.instructions or ""), "instructions name preview_submit")
            tools = (await s.list_tools()).tools
            print(f"tools: {', '.join(t.name for t in tools)}")
            by_name = {t.name: t for t in tools}
            check(set(EXPECTED) <= set(by_name), f"missing tools: {set(EXPECTED) - set(by_name)}")
            for name, (ro, destructive) in EXPECTED.items():
                t = by_name[name]
                check(t.inputSchema.get("type") == "object", f"{name}: input schema")
                check(t.outputSchema and t.outputSchema.get("type") == "object", f"{name}: output schema")
                check(t.annotations and t.annotations.readOnlyHint == ro, f"{name}: readOnlyHint")
                if destructive is not None:
                    check(t.annotations.destructiveHint == destructive, f"{name}: destructiveHint")

            q = await call(s, "list_jobs", {"limit": 5})
            me = q["you"]
            await call(s, "gpus")

            hello = f"name: hello\nimage: {image}\ngpus: 0\ncommand: echo hello from gantry; echo epoch 1 loss 0.25\n"
            ok = (await call(s, "submit_job", {"spec": hello, "file_name": "hello.yaml"}))["job_ids"][0]
            await wait_state(s, ok, ["succeeded", "failed"])
            log = await call(s, "read_log", {"id": ok, "tail": 10})
            check("hello from gantry" in log["lines"], f"the log has the job's line: {log}")
            loss = await call(s, "read_log", {"id": ok, "pattern": "LOSS"})
            check(loss["lines"] == ["epoch 1 loss 0.25"], f"pattern picks one line: {loss}")

            train = f"name: train\nimage: {image}\ngpus: 1\ntimeout: 1h\ncommand: sleep 600\n"
            before = await call(s, "list_jobs", {}, quiet=True)
            pv = await call(s, "preview_submit", {"spec": train, "file_name": "train.yaml"})
            check(pv["dry_run"] and len(pv["jobs"]) == 1, "one job previewed")
            check(pv["jobs"][0]["job"]["name"] == "train", "the previewed job")
            check(pv["jobs"][0]["starts_now"] or pv["jobs"][0].get("reason"), "where, or why it waits")
            check(any("priority" in c for c in pv["checks"]), f"limits met: {pv['checks']}")
            after = await call(s, "list_jobs", {}, quiet=True)
            check(
                [j["id"] for j in after["jobs"]] == [j["id"] for j in before["jobs"]]
                and after["queued_total"] == before["queued_total"],
                "the preview queued nothing",
            )
            print("  (the queue is unchanged: nothing was queued)")
            bad = await call(s, "preview_submit", {"spec": "image: x\ngpus: 1\ntimeout: soon\n"}, refused=True)
            check("timeout" in bad, "the spec error names the field")
            tid = (await call(s, "submit_job", {"spec": train, "file_name": "train.yaml"}))["job_ids"][0]
            await call(s, "why_waiting", {"id": tid})
            await call(s, "cancel_job", {"id": tid})
            await wait_state(s, tid, ["cancelled"])

            crash = (
                f"name: finetune\nimage: {image}\ngpus: 0\ncommand: |\n  echo loading data\n"
                "  echo 'Traceback (most recent call last):'\n"
                "  echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'\n  exit 3\n"
            )
            fid = (await call(s, "submit_job", {"spec": crash, "file_name": "finetune.yaml"}))["job_ids"][0]
            await wait_state(s, fid, ["failed"])
            tr = await call(s, "triage_job", {"id": fid})
            check(tr["exit_code"] == 3 and tr["end_reason"] == "exited", f"triage: how it ended: {tr}")
            check(any("CUDA out of memory" in l for l in tr["log_lines"]), "triage: the error line")
            check(any("batch size" in a for a in tr["advice"]), "triage: what to change")
            cmp = await call(s, "compare_jobs", {"ids": [ok, fid]})
            check("command" in cmp["differences"], f"compare: the commands differ: {cmp}")
            hist = await call(s, "job_history", {"limit": 5})
            check({ok, fid} <= {r["id"] for r in hist["runs"]}, "history lists both runs")
            await call(s, "list_bookings")
            b = await call(s, "book_gpus", {"gpus": 1, "at": "+2h", "for": "1h", "note": "demo"})
            check(b["booking"]["owner"] == me and b["booking"]["state"] == "booked", f"booked as {me}: {b}")
            check(b["rounded_up"], "+2h is rounded up to the lab's slot")
            long = await call(s, "book_gpus", {"gpus": 1, "at": "+3h", "for": "48h"}, refused=True)
            check("the lab allows bookings of at most" in long and "--for" in long, f"the lab's rule, and the fix: {long}")
            spare = (await call(s, "book_gpus", {"gpus": 1, "at": "+4h", "for": "30m"}))["id"]
            gone = await call(s, "cancel_booking", {"id": spare})
            check("cancelled" in gone["result"], f"cancelled: {gone}")
            mine = await call(s, "list_bookings", {}, quiet=True)
            check([x["id"] for x in mine["bookings"]] == [b["id"]], f"one booking left: {mine}")

            victim = f"name: long-run\nimage: {image}\ngpus: 0\ncommand: sleep 600\n"
            vid = (await call(s, "submit_job", {"spec": victim, "file_name": "long-run.yaml"}))["job_ids"][0]
            await wait_state(s, vid, ["running"])
            print("RESULT " + json.dumps({"user": me, "finished": ok, "running": vid, "booking": b["id"]}))


async def intruder(gantry, state, log_job, cancel_job, booking):
    async with stdio_client(server(gantry, state)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            await call(s, "list_jobs", {"limit": 5})
            msg = await call(s, "read_log", {"id": log_job}, refused=True)
            check("only its owner" in msg, f"a clear refusal: {msg}")
            msg = await call(s, "cancel_job", {"id": cancel_job}, refused=True)
            check("owner" in msg, f"a clear refusal: {msg}")
            d = await call(s, "show_job", {"id": cancel_job})
            check(d["state"] == "running", "the owner's job still runs")
            check(d["detail"]["job"]["spec_hidden"], "the owner's spec stays hidden")
            msg = await call(s, "cancel_booking", {"id": booking}, refused=True)
            check("only its owner or root may cancel it" in msg, f"a clear refusal: {msg}")
            print("RESULT " + json.dumps({"refused": True}))


def main():
    role = sys.argv[1]
    try:
        if role == "owner":
            asyncio.run(owner(sys.argv[2], sys.argv[3], sys.argv[4]))
        else:
            asyncio.run(intruder(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])))
    except* Failed as eg:
        print(f"FAILED: {eg.exceptions[0]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
