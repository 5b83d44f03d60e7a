"""What `store_durable` costs a turn, and what the Redis Cluster store costs, measured in one run
against Debian's redis-server on loopback:

  store time per turn (in-process RedisStore: `begin` + `finish`, history full to 10 exchanges,
  a turn record each), interleaved turn by turn so that every configuration sees the same
  moments of the machine:
    baseline:  one primary with a replica, plain writes
    durable:   the same primary, `store_durable` (WAIT 1 after the finish's writes)
    cluster:   3 primaries + 3 replicas (redis+cluster://), plain
    cluster durable: the same cluster, `store_durable`
  --hubs: also two genuine 5.x hubs on the same primary, one durable, asked in turn by their own
  HiveMindChatAgent; the ratio of their median turn latencies.

    python benchmarks/bench_durable.py [--turns 2000] [--hubs --rounds 400]

The figures go to docs/performance.md.
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

from clusters import RedisClusterSet  # noqa: E402
from test_store_durable import PrimaryAndReplica  # noqa: E402

from hivemind_chat_agent.core.transcript import ANSWERED, Exchange  # noqa: E402
from hivemind_chat_agent.hub.redis_store import RedisStore  # noqa: E402

SESSIONS = 4


def store_turn(store: RedisStore, i: int) -> float:
    """One turn's store calls as the hub makes them; seconds."""
    session = f"sat-bench{i % SESSIONS}-room"
    started = time.perf_counter()
    begun = store.begin(session, f"t{i}", client=f"bench{i % SESSIONS}")
    store.finish(session, f"t{i}", Exchange("an echo of some typical length", "an echo of "
                                            "some typical length", ANSWERED),
                 ["an echo of some typical length"], begun.history, keep_exchange=True,
                 client=f"bench{i % SESSIONS}")
    return time.perf_counter() - started


def store_times(urls: "dict[str, tuple[str, bool]]", turns: int) -> "dict[str, list[float]]":
    stores = {name: RedisStore(url, 10, 32768, 600, durable=durable)
              for name, (url, durable) in urls.items()}
    try:
        for store in stores.values():
            for i in range(SESSIONS * 12):       # every history full
                store_turn(store, i)
        samples = {name: [] for name in stores}
        for i in range(turns):
            order = list(stores) if i % 2 == 0 else list(reversed(stores))
            for name in order:
                samples[name].append(store_turn(stores[name], SESSIONS * 12 + i))
        return samples
    finally:
        for store in stores.values():
            store.close()


def hub_times(url: str, rounds: int) -> "dict[str, list[float]]":
    from hubs import HubProcess, plugin_config

    from hivemind_chat_agent import HiveMindChatAgent
    hubs = {"plain": HubProcess(plugin_config(history_turns=10, conversation_store=url)),
            "durable": HubProcess(plugin_config(history_turns=10, conversation_store=url,
                                                store_durable=True))}
    agents = {}
    try:
        for name, hub in hubs.items():
            hub.start()
            agents[name] = HiveMindChatAgent(hub.add_client(name=name).agent_config(timeout=30))
            for i in range(SESSIONS * 12):
                agents[name].get_response("warm up", session_id=f"bench-{i % SESSIONS}")
        samples = {name: [] for name in hubs}
        for i in range(rounds):
            for name in (list(hubs) if i % 2 == 0 else list(reversed(hubs))):
                started = time.perf_counter()
                assert agents[name].get_response("an echo of some typical length",
                                                 session_id=f"bench-{i % SESSIONS}")
                samples[name].append(time.perf_counter() - started)
        return samples
    finally:
        for agent in agents.values():
            agent.shutdown()
        for hub in hubs.values():
            hub.cleanup()


def report(samples: "dict[str, list[float]]", baseline: str) -> None:
    base = statistics.median(samples[baseline])
    for name, times in samples.items():
        ordered = sorted(times)
        median, p99 = statistics.median(times), ordered[int(len(ordered) * 0.99)]
        print(f"{name:>16}: median {median * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms over "
              f"{len(times)}; {median / base:.2f}x the {baseline} median")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--hubs", action="store_true", help="also two genuine hubs")
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    pair = PrimaryAndReplica(tempfile.mkdtemp(prefix="bench-durable-")).start()
    cluster = RedisClusterSet(tempfile.mkdtemp(prefix="bench-cluster-"), 3, 1).start()
    try:
        print(f"store time per turn (begin + finish), {args.turns} turns each, interleaved:")
        report(store_times({"baseline": (pair.primary.url, False),
                            "durable": (pair.primary.url, True),
                            "cluster": (cluster.url, False),
                            "cluster durable": (cluster.url, True)}, args.turns), "baseline")
        if args.hubs:
            print(f"turn latency through two genuine 5.x hubs, {args.rounds} turns each:")
            report(hub_times(pair.primary.url, args.rounds), "plain")
    finally:
        cluster.stop()
        pair.stop()


if __name__ == "__main__":
    main()
