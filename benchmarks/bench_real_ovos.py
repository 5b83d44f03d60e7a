"""HiveMindChatAgent against a genuine OVOS hub, against OVOS without HiveMind, in one run.

    python benchmarks/bench_real_ovos.py [--rounds 15]

Starts the test suite's genuine OVOS hub (tests/ovos_hub.py: ovos-core 2.1.1 and real skills,
ovos-messagebus, hivemind-core 4.0.0 with the stock hivemind-ovos-agent-plugin) and measures,
interleaved round by round:

  greeting   "hello world" (hello-world speaks with wait=True, so the client must report
             recognizer_loop:audio_output_end) until the turn is over;
  follow-up  "set an alarm" (alerts asks for the time with get_response), then the answer
             "in five hours": the answer turn, until the skill has finished with it.

Baseline: the same utterances from a plain ovos-bus-client `MessageBusClient` on the hub's own
messagebus (no HiveMind, no encryption), behaving as a satellite does: it reports audio end for
each sentence at once, carries the Session ovos-core sends back, and ends a turn where ovos-core
does (`ovos.utterance.handled` of the utterance, or of the question for an answer).
Target: ours <= 1.3 x baseline + 50 ms (medians).

Then bursts: six new sessions greeting at once, with the agent's churn guard (default) and
without it (`churn_guard: 0`), to show what the guard is for (docs/performance.md).
"""
import argparse
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from ovos_bus_client import MessageBusClient  # noqa: E402
from ovos_bus_client.message import Message  # noqa: E402
from ovos_hub import OVOSHub  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402


class BusSatellite:
    """OVOS without HiveMind: utterances straight onto the hub's messagebus."""

    def __init__(self, port: int):
        self.bus = MessageBusClient(host="127.0.0.1", port=port, route="/core")
        self.bus.run_in_thread()
        if not self.bus.connected_event.wait(10):
            raise RuntimeError("could not reach the hub's messagebus")
        self.sessions = {}
        self._lock = threading.Lock()
        self._waiters = []
        self.bus.on("message", self._on_message)

    def _on_message(self, raw):
        msg = Message.deserialize(raw) if isinstance(raw, str) else raw
        sess = msg.context.get("session") or {}
        sid = sess.get("session_id")
        if sid not in self.sessions:
            return
        if msg.context.get("bench_tag") is not None and \
                msg.msg_type not in ("recognizer_loop:utterance",
                                     "recognizer_loop:audio_output_end"):
            self.sessions[sid] = sess
        if msg.msg_type == "speak":
            self.bus.emit(Message("recognizer_loop:audio_output_end", {},
                                  {"session": self.sessions[sid],
                                   "bench_tag": msg.context.get("bench_tag")}))
        with self._lock:
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter(msg, sid)

    def turn(self, sid: str, utterance: str, ends, timeout: float = 20.0) -> float:
        """Send one utterance; `ends(msg, tag)` says when the turn is over. Returns seconds."""
        self.sessions.setdefault(sid, {"session_id": sid})
        tag = f"{sid}-{time.monotonic_ns()}"
        done = threading.Event()

        def waiter(msg, msg_sid):
            if msg_sid == sid and ends(msg, tag):
                done.set()
        with self._lock:
            self._waiters.append(waiter)
        start = time.perf_counter()
        self.bus.emit(Message("recognizer_loop:utterance", {"utterances": [utterance]},
                              {"session": self.sessions[sid], "bench_tag": tag}))
        ok = done.wait(timeout)
        took = time.perf_counter() - start
        with self._lock:
            self._waiters.remove(waiter)
        if not ok:
            raise RuntimeError(f"baseline: no end of turn for {utterance!r}")
        self.last_tag = tag
        return took

    def close(self):
        self.bus.close()


def handled_of(tag):
    return lambda msg, _t: (msg.msg_type == "ovos.utterance.handled"
                            and msg.context.get("bench_tag") == tag)


def ours(agent, sid, utterance) -> float:
    start = time.perf_counter()
    agent.get_response(utterance, session_id=sid)
    return time.perf_counter() - start


def burst(creds, guard: float, rounds: int):
    """Six new sessions greeting at the same moment, `rounds` times."""
    slowest, lost = [], 0
    for r in range(rounds):
        agent = HiveMindChatAgent(creds.agent_config(timeout=20, churn_guard=guard))
        times = []

        def greet(i):
            nonlocal lost
            start = time.perf_counter()
            try:
                if agent.get_response("hello world", session_id=f"burst-{guard}-{r}-{i}") \
                        != "Hello world":
                    lost += 1
            except Exception:
                lost += 1
            times.append(time.perf_counter() - start)
        threads = [threading.Thread(target=greet, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        agent.shutdown()
        slowest.append(max(times))
    return slowest, lost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst-rounds", type=int, default=3)
    args = ap.parse_args()
    LOG.set_level("ERROR")
    print("starting the genuine OVOS hub (ovos-core, skills, hivemind-core 4.0.0)…", flush=True)
    hub = OVOSHub().start()
    sat = agent = None
    try:
        creds = hub.add_client()
        agent = HiveMindChatAgent(creds.agent_config(timeout=20))
        sat = BusSatellite(hub.bus_port)
        # warm-up: connect, load every code path once on both sides
        ours(agent, "greet", "hello world")
        sat.turn("bus-greet", "hello world", lambda m, t: handled_of(t)(m, t))
        greet = {"ours": [], "base": []}
        answer = {"ours": [], "base": []}
        for _ in range(args.rounds):
            greet["base"].append(sat.turn("bus-greet", "hello world",
                                          lambda m, t: handled_of(t)(m, t)))
            greet["ours"].append(ours(agent, "greet", "hello world"))
            # follow-up: the question, then the timed answer
            sat.turn("bus-alarm", "set an alarm",
                     lambda m, t: m.msg_type == "speak" and m.data.get("expect_response"))
            question = sat.last_tag
            answer["base"].append(sat.turn(
                "bus-alarm", "in five hours",
                lambda m, t: (m.msg_type == "ovos.utterance.handled"
                              and m.context.get("bench_tag") == question)))
            ours(agent, "alarm", "set an alarm")
            answer["ours"].append(ours(agent, "alarm", "in five hours"))
        bursts = {guard: burst(creds, guard, args.burst_rounds) for guard in (1.0, 0.0)}
        print(f"\n{args.rounds} rounds, interleaved; medians (max)\n")
        print(f"{'turn':<22}{'ours':>18}{'baseline (bus)':>20}{'limit 1.3x+50ms':>18}  result")
        ok = True
        for name, data in (("greeting", greet), ("follow-up answer", answer)):
            o, b = statistics.median(data["ours"]), statistics.median(data["base"])
            limit = 1.3 * b + 0.050
            ok &= o <= limit
            print(f"{name:<22}{o * 1000:>9.0f} ms ({max(data['ours']) * 1000:>4.0f})"
                  f"{b * 1000:>11.0f} ms ({max(data['base']) * 1000:>4.0f})"
                  f"{limit * 1000:>15.0f} ms  {'pass' if o <= limit else 'FAIL'}"
                  f"  ({o / b:.2f}x)")
        print(f"\n{args.burst_rounds} bursts of 6 new sessions greeting at once (each burst a "
              "new agent; its shutdown closes 6 connections at once)")
        for guard, (slowest, lost) in bursts.items():
            print(f"  churn_guard={guard:g}: slowest turn per burst "
                  f"{', '.join(f'{t:.2f}' for t in slowest)} s; lost or timed out: {lost}")
        return 0 if ok else 1
    finally:
        if agent is not None:
            agent.shutdown()
        if sat is not None:
            sat.close()
        hub.cleanup()


if __name__ == "__main__":
    sys.exit(main())
