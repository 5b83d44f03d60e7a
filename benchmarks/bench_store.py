"""What the hub's history and the Redis conversation store cost a turn: two genuine 5.x hubs
with hivemind-chat-agent-plugin and the same echo engine, side by side in one run,

  baseline: history_turns 0, the memory store (what the plugin did before it kept history)
  measured: history_turns 10, conversation_store on a local redis-server

each asked the same turns by its own HiveMindChatAgent, one turn each in turn (the order flips
every round, so both see the same moments of a noisy machine: blocks of 40 turns gave ratios
from 1.08x to 1.30x for the same code); the ratio of the median turn latencies is the figure
(target <= 1.1x), in steady state (every session's history already full to 10 exchanges).

    python benchmarks/bench_store.py [--sessions 4] [--rounds 600] [--store redis|sentinel]

`--store sentinel` (issue 27): the measured hub's store is `redis+sentinel://` over a primary,
a replica and three sentinels (tests/sentinels.py) instead of one redis-server; same target.
Needs redis-server on PATH (Debian's package).
"""
import argparse
import os
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--diagnose", action="store_true",
                        help="also history in memory, and Redis without history")
    parser.add_argument("--store", choices=("redis", "sentinel"), default="redis",
                        help="the measured hub's store: one redis-server, or Redis Sentinel")
    parser.add_argument("--control", action="store_true",
                        help="the measured hub as the baseline (history off, memory store): "
                             "what the ratio is with nothing to measure")
    parser.add_argument("--measured-first", action="store_true",
                        help="start the measured hub before the baseline")
    args = parser.parse_args()
    redis = (SentinelSet if args.store == "sentinel" else RedisServer)(
        tempfile.mkdtemp(prefix="bench-redis-")).start()
    print(f"measured store: {redis.url}; load average {os.getloadavg()[0]:.1f} before")
    measured = plugin_config(history_turns=0) if args.control else \
        plugin_config(history_turns=10, conversation_store=redis.url)
    hubs = {"baseline": HubProcess(plugin_config(history_turns=0)),
            "history+redis": HubProcess(measured)}
    if args.measured_first:
        hubs = dict(reversed(list(hubs.items())))
    if args.diagnose:   # where the difference goes (not graded)
        hubs["history+memory"] = HubProcess(plugin_config(history_turns=10))
        hubs["redis, no history"] = HubProcess(plugin_config(history_turns=0,
                                                             conversation_store=redis.url))
    agents = {}
    try:
        for name, hub in hubs.items():
            hub.start()
            agents[name] = HiveMindChatAgent(hub.add_client(name=name).agent_config(timeout=30))
            for i in range(args.sessions * 12):    # every session's history full
                turn_time(agents[name], f"bench-{i % args.sessions}")
        samples = {name: [] for name in hubs}
        for i in range(args.rounds):
            order = list(hubs) if i % 2 == 0 else list(reversed(hubs))
            for name in order:
                samples[name].append(turn_time(agents[name], f"bench-{i % args.sessions}"))
        medians = {name: statistics.median(times) * 1000 for name, times in samples.items()}
        ratio = medians["history+redis"] / medians["baseline"]
        for name, median in medians.items():
            print(f"{name:>18}: median turn {median:.2f} ms over {len(samples[name])} turns")
        print(f"history_turns 10 + Redis store vs history off + memory store: {ratio:.3f}x "
              f"(target <= 1.1x): {'PASS' if ratio <= 1.1 else 'FAIL'}")
    finally:
        for agent in agents.values():
            agent.shutdown()
        for hub in hubs.values():
            hub.cleanup()
        redis.stop()


if __name__ == "__main__":
    main()
