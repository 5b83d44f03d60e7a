"""Hub hardening figures (issue 8), each against a baseline measured in the same run.

    python benchmarks/bench_hub_hardening.py [--hellos 3000] [--flood-sessions 100] [--only ...]

A genuine `hivemind-core listen` (4.0.0) with `hivemind-chat-agent-plugin` and the test engine
(tests/engines.py), in its own process on 127.0.0.1:
  1. memory: a stock satellite's connection re-HELLOs through `--hellos` session ids (one
     turn each) and disconnects, twice with new ids; the hub's RSS after each storm against
     the start (after a 50-id storm that loads every code path); target: within 5 MB;
  2. fairness: p99 of a well-behaved satellite's turns alone, then while another client (in a
     process of its own, as another machine's would be) floods its own quota from
     `--flood-sessions` session ids; target: <= 2x its idle p99, nothing refused to it.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from ovos_utils.log import LOG  # noqa: E402

LOG.set_level("ERROR")

from hivemind_bus_client.client import HiveMessageBusClient  # noqa: E402
from hivemind_bus_client.message import HiveMessage, HiveMessageType  # noqa: E402
from hubs import HubProcess  # noqa: E402
from ovos_bus_client.message import Message  # noqa: E402
from ovos_bus_client.session import Session  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent, HiveMindChatError  # noqa: E402


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def plugin(**knobs):
    return {"module": "hivemind-chat-agent-plugin",
            "hivemind-chat-agent-plugin": {"engine": "engines:ScriptEngine", **knobs}}


def storm(creds, name: str, hellos: int) -> None:
    """A stock hivemind-bus-client satellite re-HELLOs through `hellos` new session ids on one
    connection, one turn each, and leaves."""
    client = HiveMessageBusClient(key=creds.key, password=creds.password,
                                  host="ws://127.0.0.1", port=creds.port, useragent="storm")
    client.connect()
    done = threading.Event()
    client.on_mycroft("ovos.utterance.handled", lambda *_: done.set())
    for i in range(hellos):
        session = Session(f"{name}-{i}").serialize()
        client.emit(HiveMessage(HiveMessageType.HELLO, {"session": session}))
        done.clear()
        client.emit(Message("recognizer_loop:utterance", {"utterances": ["note x"]},
                            {"session": session}))
        if not done.wait(10):
            raise RuntimeError(f"no answer to turn {i}")
    client.close()
    time.sleep(3)


def memory(hellos: int) -> bool:
    hub = HubProcess(plugin()).start()
    try:
        creds = hub.add_client(name="storm")
        warm = HiveMindChatAgent(creds.agent_config())
        warm.get_response("hello", session_id="warm")
        warm.shutdown()
        storm(creds, "warm", 50)        # every code path of a stock satellite loaded once
        start = rss_mb(hub.proc.pid)
        after = []
        for n in range(2):     # new session ids each time: a leak per id grows twice
            storm(creds, f"storm-{n}", hellos)
            after.append(rss_mb(hub.proc.pid))
    finally:
        hub.cleanup()
    # Freed memory stays in the process (CPython's allocator keeps arenas that are not wholly
    # empty), so the first storm may leave a high-water mark; a leak shows as a second storm of
    # new ids growing it again.
    ok = after[0] - start <= 5 and after[1] - start <= 5
    print(f"hub RSS after {hellos} session ids on one re-HELLOing connection and its "
          f"disconnect: {start:.1f} MB at the start, {after[0]:.1f} MB after the first storm "
          f"(+{after[0] - start:.1f} MB), {after[1]:.1f} MB after a second of new ids "
          f"(+{after[1] - start:.1f} MB; target <= 5 MB of the start) {'PASS' if ok else 'FAIL'}")
    return ok


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def fairness(flood_sessions: int, turns: int) -> bool:
    hub = HubProcess(plugin(workers=8, max_queue=64)).start()
    try:
        good = HiveMindChatAgent(hub.add_client(name="good").agent_config(timeout=30))
        flood_creds = hub.add_client(name="flood")

        def measure():
            times, refused = [], 0
            for _ in range(turns):
                start = time.perf_counter()
                try:
                    good.get_response("wait 0.05", session_id="good")
                    times.append(time.perf_counter() - start)
                except HiveMindChatError:
                    refused += 1
            return times, refused
        good.get_response("hello", session_id="good")
        idle, _ = measure()
        # the flooder is another machine's client: its own process, so it competes for the
        # hub and not for this process's interpreter lock
        env = {**os.environ, "FLOOD_CONFIG": json.dumps(flood_creds.agent_config(
            timeout=30, max_connections=flood_sessions + 1))}
        flooder = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--flood-child",
                                    str(flood_sessions)], env=env, stdout=subprocess.PIPE,
                                   text=True)
        ready = flooder.stdout.readline().split()
        if ready[:1] != ["FLOODING"]:
            raise RuntimeError("the flooding client did not start")
        ramp = float(ready[1])
        time.sleep(3)                              # the flood reaches its quota
        busy, refused = measure()
        flooder.terminate()
        counts = json.loads(flooder.stdout.readline() or "{}")
        flooder.wait(30)
        good.shutdown()
    finally:
        hub.cleanup()
    ok = refused == 0 and busy and p99(busy) <= 2 * p99(idle)
    print(f"well-behaved satellite, {turns} turns of a 50 ms engine: p99 idle "
          f"{p99(idle) * 1000:.0f} ms, during a {flood_sessions}-session flood by another "
          f"client {p99(busy) * 1000:.0f} ms ({p99(busy) / p99(idle):.2f}x; target <= 2x), "
          f"refused {refused} of {turns}; the flooder got {counts.get('sent')} turns answered and "
          f"{counts.get('refused')} refused (its own quota); its {flood_sessions} connections took "
          f"{ramp:.1f} s to open {'PASS' if ok else 'FAIL'}")
    return ok


def flood_child(flood_sessions: int) -> None:
    """Flood the hub from `flood_sessions` sessions of one client until SIGTERM; print counts."""
    flooder = HiveMindChatAgent(json.loads(os.environ["FLOOD_CONFIG"]))
    stop = threading.Event()
    counts = {"sent": 0, "refused": 0}

    connected = threading.Semaphore(0)

    def flood(i):
        first = True
        while not stop.is_set():
            try:
                flooder.get_response("wait 0.5", session_id=f"flood-{i}")
                counts["sent"] += 1
            except HiveMindChatError:
                counts["refused"] += 1
                time.sleep(0.05)
            if first:
                first = False
                connected.release()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=flood, args=(i,), daemon=True)
               for i in range(flood_sessions)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for _ in threads:     # every session has its connection: the flood is at full strength
        connected.acquire()
    print(f"FLOODING {time.monotonic() - start:.1f}", flush=True)
    while not stop.wait(0.2):
        pass
    for t in threads:
        t.join(10)
    flooder.shutdown()
    print(json.dumps(counts), flush=True)


def main():
    if sys.argv[1:2] == ["--flood-child"]:
        return flood_child(int(sys.argv[2])) or 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--hellos", type=int, default=3000)
    ap.add_argument("--flood-sessions", type=int, default=100)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--only", choices=["fairness", "memory"])
    args = ap.parse_args()
    results = []
    if args.only in (None, "fairness"):
        results.append(fairness(args.flood_sessions, args.turns))
    if args.only in (None, "memory"):
        results.append(memory(args.hellos))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
