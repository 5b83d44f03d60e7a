"""The A2A front (`hivemind-chat a2a`, run as its command in a process of its own, as users run
it), every figure beside a baseline measured in the same run, on a genuine hub (the OVOS-like
test pipeline, tests/hubs.py):

  1. the first sentence of `message/stream` (its first artifact update) vs the agent's own
     `stream_sentences` first sentence on the same hub, interleaved turn by turn; medians.
     Target <= 1.1x + 5 ms. Read with http.client on a kept-alive connection (the server's
     cost, not a client library's). Beside it, not graded, the CPU time the command's
     process spent per streamed turn (/proc): on a machine shared with other work the
     latencies move with the load, its CPU time far less.
  2. 50 contexts at once (`message/send`, each told a word of its own first, then asked for
     it back): every one recalls its own word (no cross-talk); wall time beside one alone.

    python benchmarks/bench_a2a.py [--turns 100] [--generation 5]
"""
import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from hubs import HubProcess, free_port, wait_listening  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from report import Table, cpu_seconds, ms  # noqa: E402

LOG.set_level("ERROR")

import httpx  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

TABLE = Table((46, 14, 34, 16))


def rpc(method: str, text: str, context_id: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": {
        "role": "user", "kind": "message", "messageId": uuid.uuid4().hex,
        "contextId": context_id, "parts": [{"kind": "text", "text": text}]}}})


def first_streamed(conn, text: str, context_id: str) -> float:
    """Time to the first artifact update of `message/stream`, read as it arrives."""
    started = time.perf_counter()
    conn.request("POST", "/", rpc("message/stream", text, context_id),
                 {"Content-Type": "application/json", "Accept": "text/event-stream"})
    response = conn.getresponse()
    first = None
    for line in iter(response.readline, b""):
        if first is None and b'"artifact-update"' in line:
            first = time.perf_counter() - started
        if b'"final":true' in line or b'"state":"completed"' in line:
            break
    response.read()
    assert first is not None, "no sentence"
    return first


def first_direct(agent, text: str, session_id: str) -> float:
    started = time.perf_counter()
    first = None
    for _ in agent.stream_sentences([{"role": "user", "content": text}], session_id=session_id):
        if first is None:
            first = time.perf_counter() - started
    assert first is not None, "no sentence"
    return first


def answer_of(reply: dict) -> str:
    task = reply["result"]
    return "\n".join("".join(p["text"] for p in a["parts"]) for a in task.get("artifacts", []))


async def many_at_once(port: int, n: int = 50):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120,
                                 limits=httpx.Limits(max_connections=n)) as client:
        async def say(text, context):
            reply = await client.post("/", content=rpc("message/send", text, context),
                                      headers={"Content-Type": "application/json"})
            return answer_of(reply.json())
        await asyncio.gather(*(say(f"remember word{k}", f"many-{k}") for k in range(n)))
        started = time.perf_counter()
        answers = await asyncio.gather(*(say("recall", f"many-{k}") for k in range(n)))
        wall = time.perf_counter() - started
        started = time.perf_counter()
        await say("recall", "many-0")
        return wall, time.perf_counter() - started, answers


def serve_a2a(creds, port: int) -> subprocess.Popen:
    cli = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
    proc = subprocess.Popen([cli, "a2a", "--uri", f"http://127.0.0.1:{port}",
                             "--host", creds.host, "--port", str(creds.port), "--key", creds.key,
                             "--password", creds.password],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat a2a")
    except RuntimeError:
        proc.kill()
        raise
    return proc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--generation", default="5")
    args = parser.parse_args()
    hub = HubProcess(generation=args.generation).start()
    agent, server = None, None
    try:
        agent = HiveMindChatAgent(hub.add_client().agent_config(timeout=30, churn_guard=0))
        port = free_port()
        server = serve_a2a(hub.add_client(), port)
        conn = http.client.HTTPConnection("127.0.0.1", port)
        ways = {"direct": lambda: first_direct(agent, "count 2", "direct"),
                "served": lambda: first_streamed(conn, "count 2", "served")}
        for _ in range(10):                       # connections open, every path warm
            for measure in ways.values():
                measure()
        times = {name: [] for name in ways}
        cpu_before = cpu_seconds(server.pid)
        for i in range(args.turns):
            for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                times[name].append(ways[name]())
        cpu = (cpu_seconds(server.pid) - cpu_before) / args.turns
        d, s = (statistics.median(times[name]) for name in ways)
        TABLE.header()
        TABLE.row(f"message/stream first sentence, median of {args.turns}", ms(s),
                  f"stream_sentences {ms(d)}", "<= 1.1x + 5 ms", s <= 1.1 * d + 0.005)
        print(TABLE._line("  the command's CPU per streamed turn", ms(cpu),
                          f"load average {os.getloadavg()[0]:.1f}", "(not graded)", "-"))
        wall, alone, answers = asyncio.run(many_at_once(port))
        crossed = [k for k, a in enumerate(answers) if a != f"you said word{k}"]
        TABLE.row("50 contexts at once (message/send)", f"{wall:.2f} s",
                  f"one alone {ms(alone)}", "no cross-talk", not crossed)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if agent is not None:
            agent.shutdown()
        hub.cleanup()


if __name__ == "__main__":
    main()
