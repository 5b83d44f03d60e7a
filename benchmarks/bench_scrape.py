"""What one scrape of the hub plugin's `/metrics` costs the hub, beside what a turn costs it
(issue 27: hub CPU per turn with metrics on <= 1.03x off; a scrape is a fixed cost per
scrape, so its share of a turn's CPU depends on the scrape interval and the turn rate).

One genuine 5.x hub with `health` on (tests/engines.py's ScriptEngine, memory store) takes
`--turns` turns back to back (every series a chat hub fills is then filled), then is scraped
`--scrapes` times back to back in each format a scraper may ask for: the Prometheus text
format (no Accept header, as curl) and OpenMetrics (what Prometheus itself asks for first).
The figures are the hub process's CPU time (/proc), less what it spends idle over the same
time (measured first, in the same run): a scrape's, and a turn's. bench_metrics.py measures the
whole (four hubs, metrics on against off); this one says which part is the scrape.

    python benchmarks/bench_scrape.py [--turns 2000] [--scrapes 500]
"""
import argparse
import http.client
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from hubs import HubProcess, free_port, plugin_config  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from report import Table, cpu_seconds  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

LOG.set_level("ERROR")
TABLE = Table((46, 14, 34, 16))
FORMATS = (("Prometheus text", ""),
           ("OpenMetrics", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"))


def scrape(port: int, accept: str = "") -> int:
    """One GET /metrics on a new connection, as a scraper makes it; the body's length
    (bench_metrics scrapes with it too)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        return len(conn.getresponse().read())
    finally:
        conn.close()


def cpu_over(pid: int, work) -> "tuple[float, float]":
    """The CPU seconds process `pid` spent while `work()` ran, and the wall seconds it took."""
    cpu, began = cpu_seconds(pid), time.monotonic()
    work()
    return cpu_seconds(pid) - cpu, time.monotonic() - began


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=500)
    args = parser.parse_args()
    port = free_port()
    hub = HubProcess(plugin_config(health=f"127.0.0.1:{port}")).start()
    agent = None
    try:
        agent = HiveMindChatAgent(hub.add_client().agent_config(timeout=30))
        pid = hub.proc.pid
        for i in range(100):                     # connection open, every path warm
            agent.get_response("hello", session_id=f"warm{i % 16}")
        idle, idle_wall = cpu_over(pid, lambda: time.sleep(5))
        idle_rate = idle / idle_wall

        def turns():
            for i in range(args.turns):
                agent.get_response(f"echo {i}", session_id=f"s{i % 16}")
        spent, wall = cpu_over(pid, turns)
        turn = (spent - idle_rate * wall) / args.turns
        TABLE.header()
        print(TABLE._line("a turn, back to back", us(turn),
                          f"idle {idle_rate * 1e3:.2f} ms of CPU a second", "(not graded)", "-"))
        for name, accept in FORMATS:
            size = scrape(port, accept)
            spent, wall = cpu_over(pid, lambda: [scrape(port, accept)  # noqa: B023
                                                 for _ in range(args.scrapes)])
            one = (spent - idle_rate * wall) / args.scrapes
            print(TABLE._line(f"a scrape, {name} ({size / 1024:.1f} kB)", us(one),
                              f"{one / turn:.2f} turns' CPU", "(not graded)", "-"))
            for rate in (10, 100):
                print(f"  scraped every second at {rate} turns a second: a turn's CPU "
                      f"x{1 + one / (rate * turn):.3f}")
    finally:
        if agent is not None:
            agent.shutdown()
        hub.cleanup()


if __name__ == "__main__":
    main()
