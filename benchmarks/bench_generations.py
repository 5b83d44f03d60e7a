"""The client on the current HiveMind line (hivemind-core 5.x, protocol v3 / Noise), every figure
next to a baseline measured in the same run.

    python benchmarks/bench_generations.py [--rounds 15] [--sessions 256] [--bursts 2]

The hub is the stock path of a 5.x OVOS hub, each part in its own process on 127.0.0.1:
`hivemind-core listen` (5.3.10a1) + hivemind-ovos-agent-plugin 0.5.3a1 -> ovos-messagebus -> an
answering service that replies `speak` + `ovos.utterance.handled` as skills do
(tests/stock_hub.py --answer). Measured:
  1. the first turn of a new session_id on an agent that is already connected, against a warm
     turn of a known session (interleaved, medians): no handshake per session (target <= 1.5x);
  2. a fresh agent's connect + first turn, against hivemind-bus-client's own
     `HiveMessageBusClient.connect()` + the same turn (separate access keys: each pins its own
     Noise key), medians of warm rounds (the first of each is shown apart: it derives the PSK);
  3. 256 session_ids of one agent, one turn each, all at once: shared connections (at most 4)
     against one connection per session (`share_connections: false`), alternating bursts:
     wall time, hub CPU per turn (user+sys of the hivemind-core process), connections used.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_hub  # noqa: E402  (its helpers: the stock hub, rows, CPU readings)
from bench_hub import cpu_seconds, info, ms, row, run_graded, stock_hub  # noqa: E402

bench_hub.GENERATION["value"] = "5"      # every hub here is of the current line

from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402


def ask(agent, session_id, text="hello"):
    started = time.monotonic()
    answer = agent.continue_chat([AgentMessage(role=MessageRole.USER, content=text)],
                                 session_id=session_id).content
    if f"you said {text}" not in answer:
        raise RuntimeError(f"wrong answer for {session_id}: {answer!r}")
    return time.monotonic() - started


def agent_for(creds, keys_dir, **extra):
    return HiveMindChatAgent(creds.agent_config(noise_key_dir=keys_dir, timeout=20, **extra))


def bench_new_session(hub, creds, keys_dir, rounds):
    agent = agent_for(creds, keys_dir)
    try:
        ask(agent, "warm")
        ask(agent, "warm")
        warm, new = [], []
        for k in range(rounds):
            warm.append(ask(agent, "warm"))
            new.append(ask(agent, f"new-{k}"))
        w, n = statistics.median(warm), statistics.median(new)
        row("5.x: first turn of a new session_id", ms(n), f"warm turn {ms(w)}",
            "<= 1.5x warm", n <= 1.5 * w)
        info("  connections after all of it", f"{len(agent.pool)} for {rounds + 1} sessions")
    finally:
        agent.shutdown()


LIBRARY_TURN = """
import sys, threading, time
from hivemind_bus_client.client import HiveMessageBusClient
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_utils.log import LOG
LOG.set_level("ERROR")
key, password, host, port = sys.argv[1:5]
started = time.monotonic()
client = HiveMessageBusClient(key=key, password=password, host="ws://" + host, port=int(port),
                              useragent="bench-library")
done = threading.Event()
client.on_mycroft("ovos.utterance.handled", lambda _m: done.set())
client.connect(site_id="bench")
connected = time.monotonic() - started
client.emit(HiveMessage(HiveMessageType.BUS,
                        Message("recognizer_loop:utterance", {"utterances": ["hello"]})))
ok = done.wait(20)
print("RESULT", connected, time.monotonic() - started if ok else -1, flush=True)
client.close()
"""


def library_turn(creds, identity_home):
    """hivemind-bus-client's own client, as its README has it: connect(), then one turn; in a
    process whose XDG config is `identity_home` (its identity and pins), timed inside it."""
    env = {**os.environ, "XDG_CONFIG_HOME": identity_home}
    out = subprocess.run([sys.executable, "-c", LIBRARY_TURN, creds.key, creds.password,
                          creds.host, str(creds.port)], env=env, capture_output=True,
                         text=True, timeout=60).stdout
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the library client failed: {out[-500:]}")
    connected, total = (float(x) for x in line.split()[1:])
    if total < 0:
        raise RuntimeError("the library client got no answer")
    return connected, total


def ours_turn(creds, keys_dir):
    started = time.monotonic()
    agent = agent_for(creds, keys_dir)
    try:
        ask(agent, "first")
        return time.monotonic() - started
    finally:
        agent.shutdown()


def bench_connect(hub, keys_dir, rounds):
    ours_creds, lib_creds = hub.add_client(), hub.add_client()
    identity_home = tempfile.mkdtemp(prefix="bench-lib-identity-")
    ours, lib, lib_connect = [], [], []
    for _ in range(rounds):
        ours.append(ours_turn(ours_creds, keys_dir))
        connected, total = library_turn(lib_creds, identity_home)
        lib.append(total)
        lib_connect.append(connected)
    info("  first round (derives the Noise PSK)", f"ours {ms(ours[0])}, library {ms(lib[0])}")
    o, b = statistics.median(ours[1:]), statistics.median(lib[1:])
    row("5.x: connect + first turn (fresh agent)", ms(o),
        f"HiveMessageBusClient {ms(b)} (connect {ms(statistics.median(lib_connect[1:]))})",
        "<= library", o <= b)


def burst(agent, sessions, tag):
    with ThreadPoolExecutor(64) as pool:
        started = time.monotonic()
        list(pool.map(lambda k: ask(agent, f"{tag}-{k}", f"turn {k}"), range(sessions)))
        return time.monotonic() - started


def bench_many_sessions(hub, creds, keys_dir, sessions, bursts):
    pid = hub.proc.pid
    results = {"shared": [], "own": []}
    conns = {}
    for b in range(bursts):
        for mode in ("shared", "own"):
            agent = agent_for(creds, keys_dir, share_connections=(mode == "shared"),
                              max_connections=sessions, churn_guard=0)
            try:
                ask(agent, "prime")       # the PSK and the hub's first-connection costs
                cpu = cpu_seconds(pid)
                wall = burst(agent, sessions, f"{mode}{b}")
                results[mode].append((wall, (cpu_seconds(pid) - cpu) / sessions))
                conns[mode] = len(agent.pool)
            finally:
                agent.shutdown()
            time.sleep(1)                 # let the hub settle the closed connections
    (sw, sc), (ow, oc) = [tuple(statistics.median(x) for x in zip(*results[m], strict=True))
                          for m in ("shared", "own")]
    row(f"5.x: {sessions} sessions at once, connections", str(conns["shared"]),
        f"one per session: {conns['own']}", "<= 4", conns["shared"] <= 4)
    row(f"5.x: {sessions} sessions at once, wall time", f"{sw:.2f} s",
        f"one per session: {ow:.2f} s", "<= one per session", sw <= ow)
    row(f"5.x: {sessions} sessions, hub CPU per turn", ms(sc), f"one per session: {ms(oc)}",
        "<= one per session", sc <= oc)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--bursts", type=int, default=2)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; all servers on 127.0.0.1\n")
    print(f"{'measure':<44} {'value':<18} {'baseline (same run)':<36} {'target':<24} result")
    keys_dir = tempfile.mkdtemp(prefix="bench-noise-keys-")

    def steps():
        hub = stock_hub(log_level="ERROR")
        creds = hub.add_client()
        bench_new_session(hub, creds, keys_dir, args.rounds)
        bench_connect(hub, keys_dir, max(3, args.rounds // 2))
        bench_many_sessions(hub, creds, keys_dir, args.sessions, args.bursts)
    run_graded(steps)


if __name__ == "__main__":
    main()
