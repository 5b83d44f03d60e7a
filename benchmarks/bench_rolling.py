"""Turn latency through a rolling restart (issue 27: "the rolling restart's worst turn latency
stated").

    python benchmarks/bench_rolling.py [--restarts 3] [--conversations 4]

tests/replicas.py's deployment: two genuine 5.x replicas (config/server-replica.json with
tests/engines.py's ScriptEngine, their health endpoints checked by a real haproxy from
config/haproxy.cfg), one real redis-server. Conversations take quick turns through haproxy, one
thread each, without pause; meanwhile each replica in turn gets SIGTERM (it stops being ready,
drains, exits), is started again and waits until haproxy counts it up, then the next; that
`--restarts` times over. Every turn's latency is kept with the moment it began.

Printed: the steady turn before the first SIGTERM (the baseline), the turns that began during a
restart (SIGTERM until the replica is up again), their median, p99 and worst, and turns lost.
Tests/test_rolling_restart.py checks the rest (none run twice, no history forgotten).
"""
import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from replicas import ReplicaSet  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402


class Load:
    """Conversations taking turns until stopped: (began, seconds, lost) per turn."""

    def __init__(self, agent, conversations: int):
        self.agent, self.stop = agent, threading.Event()
        self.turns: list = []
        self.threads = [threading.Thread(target=self._talk, args=(f"roll-{c}",), daemon=True)
                        for c in range(conversations)]

    def _talk(self, session_id: str) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            began = time.monotonic()
            try:
                lost = self.agent.get_response(f"turn {n}", session_id=session_id) != \
                    f"you said turn {n}"
            except Exception:         # a lost turn: counted
                lost = True
            self.turns.append((began, time.monotonic() - began, lost))

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def restart(deployment: ReplicaSet, hub) -> tuple:
    """SIGTERM `hub`, wait for its exit, start it, wait until haproxy counts it up."""
    began = time.monotonic()
    hub.proc.send_signal(signal.SIGTERM)
    hub.proc.wait(60)
    deployment.restart(hub)
    return began, time.monotonic()


def summary(times: list) -> str:
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"median {statistics.median(ms):.1f} ms, p99 {p99:.0f} ms, worst {ms[-1]:.0f} ms "
            f"({len(ms)} turns)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=4)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} before")
    deployment = ReplicaSet(tempfile.mkdtemp(prefix="bench-rolling-"),
                            engine="engines:ScriptEngine").start()
    agent = HiveMindChatAgent(deployment.agent_config(timeout=30))
    try:
        agent.get_response("hello", session_id="warm")
        deployment.add_replica()
        windows = []
        with Load(agent, args.conversations) as load:
            time.sleep(5)
            steady_until = time.monotonic()
            for _ in range(args.restarts):
                for hub in list(deployment.running):
                    windows.append(restart(deployment, hub))
                    time.sleep(1)
        steady = [t for began, t, _ in load.turns if began < steady_until]
        during = [t for began, t, _ in load.turns
                  if any(start <= began <= end for start, end in windows)]
        lost = sum(1 for *_rest, was_lost in load.turns if was_lost)
        took = [end - start for start, end in windows]
        print(f"{len(windows)} replica restarts (SIGTERM to up again: median "
              f"{statistics.median(took):.1f} s)")
        print(f"steady turns before the first SIGTERM: {summary(steady)}")
        print(f"turns begun during a restart: {summary(during)}")
        print(f"turns lost: {lost} of {len(load.turns)} (target 0): "
              f"{'PASS' if lost == 0 else 'FAIL'}")
        return 0 if lost == 0 else 1
    finally:
        agent.shutdown()
        deployment.stop()


if __name__ == "__main__":
    sys.exit(main())
