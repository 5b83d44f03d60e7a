"""Client ChatEngine benchmark: every figure next to a baseline measured in the same run.

    python benchmarks/bench_client.py [--turns 300] [--sessions 15] [--generation 4.0|5]

Starts a genuine hivemind-core hub (tests/hub_process.py, its own process, 127.0.0.1) of the
given generation (4.0, the default, from its own venv: tests/hub_venvs.py; 5 from this one) and
compares HiveMindChatAgent with hand-written hivemind-bus-client code against the same hub:
  1. first turn on a new session_id (connect + handshake + turn) vs the library's connect();
  2. steady-state turn vs a raw HiveMessageBusClient turn (interleaved, medians);
  3. stream_sentences: delay from a speak frame reaching the client to the sentence's yield;
  4. wrong key / wrong password / hub down: time to a clear error, vs the library (capped).
"""
import argparse
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from hubs import HubProcess, free_port  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402

LOG.set_level("ERROR")   # both sides pay for ovos logging otherwise; keep it equal and low

from hivemind_bus_client.client import HiveMessageBusClient  # noqa: E402
from ovos_bus_client.message import Message  # noqa: E402
from ovos_bus_client.session import Session  # noqa: E402
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent, HiveMindChatError  # noqa: E402
from hivemind_chat_agent.client.connection import HubConnection  # noqa: E402

ROWS = []


def row(name, value, baseline, target, ok):
    ROWS.append((name, value, baseline, target, "PASS" if ok else "FAIL"))
    print(f"{name:<46} {value:<16} {baseline:<30} {target:<22} {'PASS' if ok else 'FAIL'}",
          flush=True)


def ms(seconds):
    return f"{seconds * 1000:.1f} ms"


def library_client(creds, password=None, key=None, port=None):
    return HiveMessageBusClient(key=key or creds.key, password=password or creds.password,
                                host="ws://127.0.0.1", port=port or creds.port,
                                useragent="bench-raw", self_signed=True)


def time_library_connect(creds, runs):
    times, clients = [], []
    for _ in range(runs):
        c = library_client(creds)
        t = time.perf_counter()
        c.connect()
        times.append(time.perf_counter() - t)
        clients.append(c)
    return times, clients


def raw_turn(client, session, utterance="hello"):
    """A hand-written library turn: emit, collect speaks, wait for handled."""
    done, spoken = threading.Event(), []
    on_speak = lambda m: spoken.append(m.data["utterance"])
    on_done = lambda m: done.set()
    client.on_mycroft("speak", on_speak)
    client.on_mycroft("ovos.utterance.handled", on_done)
    client.emit(Message("recognizer_loop:utterance", {"utterances": [utterance]},
                        {"session": session.serialize()}))
    done.wait(10)
    client.internal_bus.remove("speak", on_speak)
    client.internal_bus.remove("ovos.utterance.handled", on_done)
    return "\n".join(spoken)


def time_until_error(fn, cap):
    """Seconds until fn raises, or None if it neither raised nor returned within `cap`."""
    result = {}

    def run():
        t = time.perf_counter()
        try:
            fn()
            result["t"] = ("returned", time.perf_counter() - t)
        except Exception as e:
            result["t"] = (type(e).__name__, time.perf_counter() - t)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(cap)
    return result.get("t")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--sessions", type=int, default=15)
    ap.add_argument("--library-connects", type=int, default=3)
    ap.add_argument("--error-cap", type=float, default=12.0)
    ap.add_argument("--generation", choices=("4.0", "5"), default="4.0")
    args = ap.parse_args()

    hub = HubProcess(generation=args.generation).start()
    try:
        creds = hub.add_client(name="bench")
        # the library's own key: a 5.x hub pins one Noise key per access key
        lib_creds = hub.add_client(name="bench-lib") if args.generation != "4.0" else creds
        print(f"hub: hivemind-core {args.generation} on 127.0.0.1:{hub.port}\n")
        print(f"{'measure':<46} {'value':<16} {'baseline (same run)':<30} {'target':<22} result")

        # 1. first turn on a new session_id vs the library's connect()
        lib_times, lib_clients = time_library_connect(lib_creds, args.library_connects)
        agent = HiveMindChatAgent(creds.agent_config())
        firsts = []
        for i in range(args.sessions):
            t = time.perf_counter()
            assert agent.get_response("hello", session_id=f"first-{i}") == "hello there"
            firsts.append(time.perf_counter() - t)
        first_med = statistics.median(firsts)
        lib_med = statistics.median(lib_times)
        row("first turn, new session (median)", ms(first_med),
            f"lib connect() {ms(lib_med)} ({first_med / lib_med:.2f}x)", "<= 250 ms",
            first_med <= 0.25)
        row("first turn, new session (max)", ms(max(firsts)),
            f"lib connect() max {ms(max(lib_times))}", "(info)", True)

        # 2. steady state, interleaved so drift hits both equally
        raw = lib_clients[0]
        raw_session = Session(raw.session_id)
        assert raw_turn(raw, raw_session) == "hello there"
        msgs = [AgentMessage(MessageRole.USER, "hello")]
        agent.continue_chat(msgs, session_id="steady")
        ours, theirs = [], []
        for i in range(args.turns):
            pair = [("ours", lambda: agent.continue_chat(msgs, session_id="steady")),
                    ("raw", lambda: raw_turn(raw, raw_session))]
            if i % 2:
                pair.reverse()
            for name, fn in pair:
                t = time.perf_counter()
                fn()
                (ours if name == "ours" else theirs).append(time.perf_counter() - t)
        o, r = statistics.median(ours), statistics.median(theirs)
        row("steady-state turn (median)", ms(o), f"raw library turn {ms(r)}",
            "<= 1.05x raw", o / r <= 1.05)
        print(f"{'':<46} ratio {o / r:.3f}x  (p90 ours {ms(sorted(ours)[int(.9 * len(ours))])}, "
              f"raw {ms(sorted(theirs)[int(.9 * len(theirs))])})")
        for c in lib_clients:
            c.close()

        # 3. stream latency: frame reaches _on_bus -> sentence yielded
        arrivals = {}
        original = HubConnection._on_bus

        def stamped(self, payload):
            if payload.msg_type == "speak":
                arrivals[payload.data.get("utterance")] = time.perf_counter()
            return original(self, payload)
        HubConnection._on_bus = stamped
        delays = []
        try:
            for _ in range(20):
                for sentence in agent.stream_sentences(
                        [AgentMessage(MessageRole.USER, "slow 5 0.02")], session_id="stream"):
                    delays.append(time.perf_counter() - arrivals[sentence])
        finally:
            HubConnection._on_bus = original
        worst = max(delays)
        row("stream: speak arrival -> yield (max)", ms(worst),
            f"median {ms(statistics.median(delays))} over {len(delays)}", "<= 5 ms", worst <= 0.005)
        agent.shutdown()

        # 4. faults: ours vs the library, the library capped at --error-cap seconds
        def ours_error(**cfg):
            a = HiveMindChatAgent({**creds.agent_config(), **cfg})
            try:
                return time_until_error(lambda: a.get_response("hello", session_id="err"), 30)
            finally:
                a.shutdown()

        def lib_error(**kw):
            return time_until_error(lambda: library_client(lib_creds, **kw).connect(),
                                    args.error_cap)

        def fmt(res):
            return f"{res[0]} after {res[1]:.2f} s" if res else \
                f"no error after {args.error_cap:g} s"
        down = free_port()
        for name, ours_kw, lib_kw, limit in [
                ("wrong access key", {"key": "nope-" + creds.key[:4]},
                 {"key": "nope-" + creds.key[:4]}, 5.0),
                ("wrong password", {"password": "nope"}, {"password": "nope"}, 5.0),
                ("hub down (connect_timeout 3 s)", {"port": down, "connect_timeout": 3},
                 {"port": down}, 3.0)]:
            res = ours_error(**ours_kw)
            ok = bool(res) and res[0] != "returned" and res[1] <= limit
            row(name, f"{res[1]:.2f} s" if res else "none", "lib: " + fmt(lib_error(**lib_kw)),
                f"<= {limit:g} s, typed", ok and issubclass(
                    getattr(sys.modules["hivemind_chat_agent"], res[0], Exception),
                    HiveMindChatError))
    finally:
        hub.cleanup()
    failed = [r for r in ROWS if r[-1] == "FAIL"]
    print(f"\n{len(ROWS) - len(failed)} passed, {len(failed)} failed")
    os._exit(1 if failed else 0)   # library clients of step 4 are still reconnecting


if __name__ == "__main__":
    main()
