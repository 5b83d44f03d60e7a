"""Home Assistant's load on the stable HiveMind install (hivemind-core 4.0.0, a genuine
ovos-messagebus with an answering service: tests/stock_hub.py), through the stock
hivemind-ovos-agent-plugin 0.1.0 and through our plugin's OVOS mode, in the same run.

    python benchmarks/bench_ha_load.py [--runs 5] [--burners 1] [--plugins stock,ovos-mode]

Each run is tests/home_assistant.load_phases through the Wyoming front (20 new conversations one
after another, 20 at once, 40 steady turns: 80 turns), with `--burners` processes keeping cores
busy (tests/cpu_burner.py), as a machine with a little other work has them. Counted per run: the
turns lost (no answer, or not their own), and whether the hub log shows the stock plugin's races
(tornado's iostream AssertionError from writing off the IO loop, "dictionary changed size").
Target: the OVOS mode loses 0 turns in every run; the stock plugin's count is its baseline.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from cpu_burner import cpu_burner  # noqa: E402
from home_assistant import Server, load_phases  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from report import Table  # noqa: E402
from stock_hub import PLUGINS, STOCK_PLUGIN_RACES, StockOVOSHub  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

LOG.set_level("ERROR")
TURNS_PER_RUN = 80


def one_run(hub, run, burners):
    """(turns lost, seconds) of one load run on `hub`."""
    agent = HiveMindChatAgent(hub.add_client().agent_config(timeout=10))
    server = Server(agent)
    started = time.monotonic()
    try:
        with cpu_burner(burners):
            lost = load_phases(server.port, f"run{run}", lambda phase, i: f"{phase} {i}",
                               lambda said, reply: f"you said {said}" in reply)
    finally:
        server.stop()
        agent.shutdown()
    return len(lost), time.monotonic() - started


def measure(plugin, runs, burners):
    hub = StockOVOSHub(plugin=plugin).start()
    try:
        results = [one_run(hub, run, burners) for run in range(runs)]
        races = sorted({race for race in STOCK_PLUGIN_RACES if race in hub.logs()})
    finally:
        hub.cleanup()
    for run, (lost, seconds) in enumerate(results):
        print(f"  {plugin:<10} run {run}: {lost:>2} of {TURNS_PER_RUN} lost in {seconds:.1f} s",
              flush=True)
    return [lost for lost, _ in results], races


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--burners", type=int, default=1, help="CPU burner processes during runs")
    ap.add_argument("--plugins", default=",".join(PLUGINS))
    args = ap.parse_args()
    plugins = [p for p in args.plugins.split(",") if p]
    print(f"{os.cpu_count()} CPUs; {args.burners} burner(s); hivemind-core 4.0.0; "
          f"{args.runs} runs of {TURNS_PER_RUN} turns per plugin\n", flush=True)
    measured = {plugin: measure(plugin, args.runs, args.burners) for plugin in plugins}
    table = Table((46, 22, 40, 14))
    print()
    table.header()
    stock = measured.get("stock")
    baseline = (f"stock: {sum(stock[0])} lost, runs {stock[0]}" + (
        f", log: {', '.join(stock[1])}" if stock[1] else "")) if stock else "not measured"
    failed = 0
    if "ovos-mode" in measured:
        lost, races = measured["ovos-mode"]
        ok = sum(lost) == 0 and not races
        failed += not table.row("turns lost, OVOS mode, under the burner",
                                f"{sum(lost)}, runs {lost}", baseline, "0 every run", ok)
        if races:
            print(f"  the OVOS mode's hub log shows: {', '.join(races)}")
    elif stock:
        print(f"stock plugin: {baseline}")
    print(f"\n{'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
