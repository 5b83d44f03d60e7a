"""What the hub's history and the Redis conversation store cost a turn: genuine 5.x hubs
with hivemind-chat-agent-plugin and the same echo engine, in one run,

  baseline: history_turns 0, the memory store (what the plugin did before it kept history)
  measured: history_turns 10, conversation_store on a local redis-server

two hubs of each, started in the order baseline, measured, measured, baseline (START_ORDER:
the first hub started here is the faster one, by up to 4 %, `--control` shows it), each asked
the same turns by its own HiveMindChatAgent, one turn each in turn, in a new order every round
(a fixed rotation gave each hub the same predecessor: -1.3 to -2.2 % for the middle two in
`--control`), so all see the same moments of a noisy machine. The figure is the ratio of the median
turn latencies, both measured hubs against both baseline ones (target <= 1.1x), in steady
state (every session's history already full to 10 exchanges); printed beside it, how far the
two hubs of a kind are apart (a ratio within that says nothing).

    python benchmarks/bench_store.py [--sessions 4] [--rounds 600] [--store redis|sentinel]

`--store sentinel` (issue 27): the measured hubs' store is `redis+sentinel://` over a primary,
a replica and three sentinels (tests/sentinels.py) instead of one redis-server; same target.
Needs redis-server on PATH (Debian's package).
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from hubs import HubProcess, plugin_config  # noqa: E402
from sentinels import SentinelSet  # noqa: E402
from servers import RedisServer  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402


def turn_time(agent, session_id) -> float:
    started = time.perf_counter()
    answer = agent.get_response("an echo of some typical length for a voice assistant",
                                session_id=session_id)
    assert answer, "no answer"
    return time.perf_counter() - started


START_ORDER = ("baseline-a", "measured-a", "measured-b", "baseline-b")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--diagnose", action="store_true",
                        help="also history in memory, and Redis without history (one hub "
                             "each, started last, not graded)")
    parser.add_argument("--store", choices=("redis", "sentinel"), default="redis",
                        help="the measured hubs' store: one redis-server, or Redis Sentinel")
    parser.add_argument("--control", action="store_true",
                        help="the measured hubs as the baseline (history off, memory store): "
                             "what the ratio is with nothing to measure")
    args = parser.parse_args()
    redis = (SentinelSet if args.store == "sentinel" else RedisServer)(
        tempfile.mkdtemp(prefix="bench-redis-")).start()
    print(f"measured store: {redis.url}; load average {os.getloadavg()[0]:.1f} before")
    measured = plugin_config(history_turns=0) if args.control else \
        plugin_config(history_turns=10, conversation_store=redis.url)
    configs = {name: measured if name.startswith("measured") else
               plugin_config(history_turns=0) for name in START_ORDER}
    if args.diagnose:   # where the difference goes (not graded)
        configs["history+memory"] = plugin_config(history_turns=10)
        configs["redis, no history"] = plugin_config(history_turns=0,
                                                     conversation_store=redis.url)
    hubs = {name: HubProcess(config) for name, config in configs.items()}
    agents = {}
    try:
        for name, hub in hubs.items():
            hub.start()
            agents[name] = HiveMindChatAgent(hub.add_client(name=name).agent_config(timeout=30))
            for i in range(args.sessions * 12):    # every session's history full
                turn_time(agents[name], f"bench-{i % args.sessions}")
        samples = {name: [] for name in hubs}
        order = random.Random(27)       # the same orders every run
        for i in range(args.rounds):
            for name in order.sample(list(hubs), len(hubs)):
                samples[name].append(turn_time(agents[name], f"bench-{i % args.sessions}"))
        report(samples)
    finally:
        for agent in agents.values():
            agent.shutdown()
        for hub in hubs.values():
            hub.cleanup()
        redis.stop()


def report(samples):
    """Each hub's median, the two kinds' ratio, and how far two hubs of a kind are apart."""
    median = {name: statistics.median(times) * 1000 for name, times in samples.items()}
    for name, value in median.items():
        print(f"{name:>18}: median turn {value:.2f} ms over {len(samples[name])} turns")
    kind = {k: statistics.median(samples[f"{k}-a"] + samples[f"{k}-b"]) for k in
            ("baseline", "measured")}
    apart = max(max(median[f"{k}-a"], median[f"{k}-b"]) / min(median[f"{k}-a"],
                                                                 median[f"{k}-b"])
                for k in ("baseline", "measured"))
    ratio = kind["measured"] / kind["baseline"]
    print(f"history_turns 10 + Redis store vs history off + memory store: {ratio:.3f}x "
          f"(target <= 1.1x): {'PASS' if ratio <= 1.1 else 'FAIL'}; two hubs of a kind up "
          f"to {apart:.3f}x apart")


if __name__ == "__main__":
    main()
