"""What the hub plugin's metrics cost (issue 27: hub CPU per turn with metrics on <= 1.03x metrics
off). Four genuine 5.x hubs run at once, the same plugin and engine (tests/engines.py's
ScriptEngine): two with `health` on, each scraped every second as Prometheus would, two
without; turns go to them in turn (one agent each, the order rotating), so all see the same
machine. The figure is the hubs' CPU time per turn (/proc), which the machine's other work
moves far less than latencies: the two "on" hubs' against the two "off" hubs'. Two hubs of a
kind measure the noise between processes doing the same (printed beside the ratio: a ratio
within it says nothing); the turn latencies are printed, not graded. The hubs start in the
order on, off, off, on (START_ORDER): where a hub was started moves its CPU a turn by more than
the metrics do, and `--control` (all four off) shows what is left of that.

    python benchmarks/bench_metrics.py [--turns 2000] [--rounds 1] [--scrape-every 1.0] [--control]
                                       [--store memory|redis]

`--rounds N`: N rounds of four fresh hubs, every other one with the on and off hubs in each
other's slots; the ratio printed last pools every round. `--store redis`: all four hubs keep
their conversations (history_turns 10) on one local redis-server (Debian's, on PATH), the
deployment of a hub tier, where the store's calls are timed (`hivemind_chat_store_seconds`);
on the memory store (the default) they are not (hub/metrics.py).
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from bench_scrape import scrape  # noqa: E402
from hubs import HubProcess, free_port, plugin_config  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from report import Table, cpu_seconds, ms  # noqa: E402
from servers import RedisServer  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

LOG.set_level("ERROR")
# started, and given their agents, in this order: A B B A. With all four hubs alike
# (`--control`), the first two started used 2.4-2.6 % more CPU a turn than the last two, so
# on-on-off-off measured that as the metrics' cost.
START_ORDER = ("on-a", "off-a", "off-b", "on-b")
# every other round of `--rounds`: the slots of the on hubs are the off hubs' of the round before
SWAPPED_ORDER = ("off-a", "on-a", "on-b", "off-b")
TABLE = Table((46, 14, 34, 16))


def scraping(port: int, stop: threading.Event, every: float) -> threading.Thread:
    """GET /metrics every `every` s until `stop`, as a Prometheus server scrapes."""
    def scrape_until_stopped():
        while not stop.wait(every):
            try:
                scrape(port)
            except OSError:
                pass
    thread = threading.Thread(target=scrape_until_stopped, daemon=True)
    thread.start()
    return thread


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of four fresh hubs; every other one swaps the on and off "
                             "slots (SWAPPED_ORDER), so that what a slot costs cancels out")
    parser.add_argument("--scrape-every", type=float, default=1.0,
                        help="seconds between scrapes of each 'on' hub (0: none)")
    parser.add_argument("--control", action="store_true",
                        help="all four hubs with metrics off: what the figure is with nothing "
                             "to measure (the hubs' positions and the machine's noise)")
    parser.add_argument("--store", choices=("memory", "redis"), default="memory",
                        help="the hubs' conversation store: memory, or one local redis-server "
                             "with history_turns 10")
    args = parser.parse_args()
    redis = RedisServer(tempfile.mkdtemp(prefix="bench-redis-")).start() \
        if args.store == "redis" else None
    try:
        measure(args, {} if redis is None else {"conversation_store": redis.url,
                                                "history_turns": 10})
    finally:
        if redis is not None:
            redis.stop()


def measure(args, store: Dict[str, object]) -> None:
    """The rounds, and the table: `store` is the hubs' store settings."""
    used: Dict[str, List[float]] = {"on": [], "off": []}
    times: Dict[str, List[float]] = {"on": [], "off": []}
    TABLE.header()
    for number in range(args.rounds):
        order = START_ORDER if number % 2 == 0 else SWAPPED_ORDER
        round_used, round_times = one_round(args, order, store)
        for name, seconds in round_used.items():
            used[name[:-2]].append(seconds)
            times[name[:-2]] += round_times[name]
        kinds = {kind: [round_used[f"{kind}-a"], round_used[f"{kind}-b"]]
                 for kind in ("on", "off")}
        noise = max(max(a / b, b / a) for a, b in kinds.values())
        print(f"round {number + 1} ({', '.join(order)}): ratio "
              f"{statistics.mean(kinds['on']) / statistics.mean(kinds['off']):.3f}x; between "
              f"two hubs of a kind up to {noise:.3f}x", flush=True)
    on, off = statistics.mean(used["on"]), statistics.mean(used["off"])
    TABLE.row(f"hub CPU per turn, metrics on ({args.rounds} x {args.turns} turns)", ms(on),
              f"metrics off {ms(off)}", "<= 1.03x", on <= 1.03 * off)
    print(TABLE._line("  turn latency, median", ms(statistics.median(times["on"])),
                      f"off {ms(statistics.median(times['off']))}, "
                      f"load {os.getloadavg()[0]:.1f}", "(not graded)", "-"))
    print(f"ratio {on / off:.3f}x, {args.store} store" + (
        "; --control: all four hubs had metrics off" if args.control else ""))


def one_round(args, order, store) -> Tuple[Dict[str, float], Dict[str, List[float]]]:
    """Four hubs started in `order` with the store settings `store`, `args.turns` turns to
    each in a rotating order: each hub's CPU seconds per turn and its turns' latencies, by hub
    name."""
    ports = {name: free_port() for name in ("on-a", "on-b")}
    measured = () if args.control else ports
    hubs = {name: HubProcess(plugin_config(**store, **({"health": f"127.0.0.1:{ports[name]}"}
                                                       if name in measured else {}))).start()
            for name in order}
    agents, stop = {}, threading.Event()
    try:
        agents = {name: HiveMindChatAgent(hub.add_client().agent_config(timeout=30))
                  for name, hub in hubs.items()}
        for _ in range(50):                        # connections open, every path warm
            for agent in agents.values():
                agent.get_response("hello", session_id="warm")
        for port in ports.values() if args.scrape_every > 0 and measured else ():
            scraping(port, stop, args.scrape_every)
        names = list(hubs)
        times: Dict[str, List[float]] = {name: [] for name in hubs}
        cpu = {name: cpu_seconds(hub.proc.pid) for name, hub in hubs.items()}
        for i in range(args.turns):
            for name in names[i % 4:] + names[:i % 4]:
                started = time.perf_counter()
                agents[name].get_response(f"echo {i}", session_id=f"s{i % 16}")
                times[name].append(time.perf_counter() - started)
        return ({name: (cpu_seconds(hub.proc.pid) - cpu[name]) / args.turns
                 for name, hub in hubs.items()}, times)
    finally:
        stop.set()
        for agent in agents.values():
            agent.shutdown()
        for hub in hubs.values():
            hub.cleanup()


if __name__ == "__main__":
    main()
