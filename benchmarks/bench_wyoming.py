"""The Wyoming front (`hivemind-chat wyoming`), driven as Home Assistant drives it: every figure
next to a baseline measured in the same run.

    python benchmarks/bench_wyoming.py [--generation 5|4.0] [--turns 100]

A genuine hivemind-core hub on 127.0.0.1 (the OVOS-like test pipeline, tests/hubs.py):
  1. Transcript -> Handled over a new TCP connection per turn (the real `wyoming` client
     library), vs a direct `continue_chat` on the same hub; interleaved medians.
     Target <= 1.1x + 5 ms.
  2. 20 new conversations at once against a hub with a 1-second answering engine (our plugin,
     tests/engines.py "slow 1 1"), vs one such turn alone, with the agent's churn_guard
     (1 s, the default) and without it (0), and with 2 (the server's default) and 20 spare
     connections (4.x hubs: handshakes done before the conversations come). Target <= 1.5x.
"""
import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from hubs import HubProcess, free_port, plugin_config  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from report import Table, ms  # noqa: E402

LOG.set_level("ERROR")

from wyoming.asr import Transcript  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.handle import Handled, NotHandled  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402
from hivemind_chat_agent.bridges.wyoming_server import WyomingBridge, run_server  # noqa: E402

TABLE = Table((46, 14, 34, 16))
row = TABLE.row


async def ha_turn(port, text, conversation_id):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcript(text, context={"conversation_id": conversation_id},
                                            language="en-US").event())
        while True:
            event = await client.read_event()
            if Handled.is_type(event.type) or NotHandled.is_type(event.type):
                return event.data.get("text")


def serve(agent):
    port = free_port()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_until_complete,
                     args=(run_server(WyomingBridge(agent), "127.0.0.1", port),),
                     daemon=True).start()
    time.sleep(0.5)
    return port


def concurrency(generation, served_extra):
    """20 new HA conversations at once against a hub whose engine takes 1 s per answer (our
    plugin with tests/engines.py; workers enough for 20, all from the bridge's one key), vs
    one such turn alone; with the agent's churn_guard and without it, and with spare
    connections (used on 4.x hubs only), filled before each measure as a running server has
    them."""
    hub = HubProcess(plugin_config(timeout=10, workers=32, workers_per_client=32,
                                   max_queue_per_client=64), generation=generation).start()
    rows = []
    configs = [(served_extra.get("churn_guard"), 0)] if served_extra else \
        [(1.0, 0), (0.0, 0), (1.0, 2), (1.0, 20)]
    try:
        for guard, spares in configs:
            agent = HiveMindChatAgent(hub.add_client().agent_config(
                timeout=30, churn_guard=guard, spare_connections=spares))
            port = serve(agent)
            loop = asyncio.new_event_loop()
            name = f"{guard:g}-{spares}"

            async def one(k):
                return await ha_turn(port, "slow 1 1", f"slow-{name}-{k}")
            agent.warm_up()
            loop.run_until_complete(ha_turn(port, "hello", f"warm-{name}"))   # connected
            spares_ready(agent, spares)
            start = time.perf_counter()
            loop.run_until_complete(one("alone"))     # a new conversation, as each of the 20
            alone = time.perf_counter() - start
            spares_ready(agent, spares)

            async def twenty():
                return await asyncio.gather(*(one(k) for k in range(20)))
            start = time.perf_counter()
            answers = loop.run_until_complete(twenty())
            together = time.perf_counter() - start
            assert answers == ["slow sentence 1"] * 20, answers
            label = f"20 at once, churn_guard {guard:g}" + \
                (f", {spares} spares" if spares else "")
            rows.append(row(label, ms(together), f"one 1 s turn alone {ms(alone)} "
                            f"({together / alone:.2f}x)", "<= 1.5x", together <= 1.5 * alone))
            agent.shutdown()
    finally:
        hub.cleanup()
    return rows


def spares_ready(agent, count, wait=30.0):
    """A server that has been running has its spares (4.x hubs; 5.x shares one connection)."""
    if agent.pool.sharing is False:
        agent.pool.spares.settle(wait)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generation", choices=("4.0", "5"), default="5")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--churn-guard", type=float, default=None,
                    help="the served agent's churn_guard (default: the agent's, 1 s)")
    args = ap.parse_args()
    hub = HubProcess(generation=args.generation).start()
    results = []
    try:
        creds = hub.add_client(name="bench-wyoming")
        extra = {} if args.churn_guard is None else {"churn_guard": args.churn_guard}
        served = HiveMindChatAgent(creds.agent_config(timeout=30, **extra))
        direct = HiveMindChatAgent(hub.add_client(name="bench-direct").agent_config(timeout=30))
        port = serve(served)
        print(f"hub: hivemind-core {args.generation} on 127.0.0.1\n")
        TABLE.header()
        loop = asyncio.new_event_loop()
        assert loop.run_until_complete(ha_turn(port, "hello", "warm")) == "hello there"
        direct.continue_chat([{"role": "user", "content": "hello"}], session_id="warm")
        wy, di = [], []
        for _ in range(args.turns):
            start = time.perf_counter()
            assert loop.run_until_complete(ha_turn(port, "hello", "warm")) == "hello there"
            wy.append(time.perf_counter() - start)
            start = time.perf_counter()
            direct.continue_chat([{"role": "user", "content": "hello"}], session_id="warm")
            di.append(time.perf_counter() - start)
        w, d = statistics.median(wy), statistics.median(di)
        results.append(row("Transcript -> Handled (median)", ms(w),
                           f"continue_chat {ms(d)} ({w / d:.2f}x)", "<= 1.1x + 5 ms",
                           w <= 1.1 * d + 0.005))

        results += concurrency(args.generation, served_extra=extra)
        served.shutdown()
        direct.shutdown()
    finally:
        hub.cleanup()
    print(f"\n{sum(results)}/{len(results)} targets met")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
