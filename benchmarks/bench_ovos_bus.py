"""A turn through the OVOS messagebus, with and without keep_acks_quick()
(hivemind_chat_agent/hub/bus_socket.py), beside the bus's own round trip in the same run (issue 31).

    python benchmarks/bench_ovos_bus.py [--generation 5|4.0] [--rounds 50] [--quick-loopback]

`--quick-loopback` (benchmarks/loopback.py): the same in a network namespace whose loopback
route acknowledges at once (config/quick-loopback.sh): every stall below is gone there.

On 127.0.0.1, each in its own process, from the OVOS hub venv of the generation (5:
ovos-messagebus 0.2.1a6 in ovos-hub-5; 4.0: 0.0.10 in ovos-hub): two genuine ovos-messagebus,
and answering services (that venv's ovos-bus-client MessageBusClient; each answers the
utterances addressed to it with `speak` and `ovos.utterance.handled` by Message.reply, as a skill
does from ovos-core's connection):
  the stock bus     with a "stock" answering service (as ovos-core's connection is) and a
                    "quick" one (keep_acks_quick applied);
  the baseline bus  the same ovos-messagebus with TCP_NODELAY set on its sockets when they open
                    (a sitecustomize, for this measure only), the same answering services and
                    as many clients: the bus's own round trip, in which nothing can wait for an
                    ACK.
The plugin-like clients are MessageBusClients of this process, stock and quick (the recipe of
keep_acks_quick's docstring); a turn is from the utterance's emit until its `handled` reaches
the client's handler.

Every round runs each case once, in a shuffled order, each after 250 ms of quiet (every delayed
ACK has fired by then: Linux waits 200 ms at most); "back to back" measures a turn sent right
after the previous turn's `handled`, "after traffic" a turn sent right after the client read a
bus message (the echo of a small one of its own: the OVOS mode's connection reads every
client's traffic, so this is its usual case). On the stock bus a stock client waits for its
own delayed ACK of the utterance's echo (the bus holds `speak` behind it), and the stock
answering service's delayed ACK of the echoes of its own answers holds the next utterance's
echo to it: the client's part is what keep_acks_quick removes (target <= 1.2x baseline); the
answering service's is not the client's to remove (shown).
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from loopback import add_option, maybe_rerun  # noqa: E402

from hivemind_chat_agent.hub.bus_socket import keep_acks_quick  # noqa: E402

QUIET = 0.25


def bus_client_class(quick: bool):
    """ovos-bus-client's MessageBusClient, with keep_acks_quick applied as its docstring says."""
    from ovos_bus_client import MessageBusClient

    class Bus(MessageBusClient):
        def on_open(self, *args):
            if quick and not keep_acks_quick(self.client.sock):
                raise RuntimeError("keep_acks_quick could not be applied")
            super().on_open(*args)
    return Bus


def answering_service(port: int, name: str, quick: bool) -> None:
    """tests/stock_hub.py's answering service, answering only the utterances for `name`."""
    from ovos_utils.log import LOG
    from pyee import EventEmitter
    LOG.set_level("ERROR")
    bus = bus_client_class(quick)(host="127.0.0.1", port=port, emitter=EventEmitter())

    def on_utterance(message):
        if message.data.get("responder") != name:
            return
        bus.emit(message.reply("speak", {"utterance": "you said hello", "lang": "en-US",
                                         "expect_response": False,
                                         "meta": {"skill": "bench.echo"}}))
        bus.emit(message.reply("ovos.utterance.handled", {}))
    bus.on("recognizer_loop:utterance", on_utterance)
    bus.run_in_thread()
    if not bus.connected_event.wait(30):
        sys.exit("the answering service could not connect")
    print("READY", flush=True)
    threading.Event().wait()


class Client:
    """A plugin-like bus client: emits, and waits for the reply with its tag."""

    def __init__(self, port: int, quick: bool):
        from pyee import EventEmitter
        self.bus = bus_client_class(quick)(host="127.0.0.1", port=port, emitter=EventEmitter())
        self.waiting, self.done = None, threading.Event()
        for topic in ("ovos.utterance.handled", "bench.tick"):
            self.bus.on(topic, self._on_reply)
        self.bus.run_in_thread()
        if not self.bus.connected_event.wait(30):
            raise RuntimeError("no connection to the messagebus")
        self.count = 0

    def _on_reply(self, message):
        if (message.msg_type, message.context.get("bench_tag")) == self.waiting:
            self.done.set()

    def _exchange(self, topic, reply, data) -> float:
        from ovos_bus_client.message import Message
        self.count += 1
        tag = f"{id(self)}-{self.count}"
        self.waiting = (reply, tag)
        self.done.clear()
        started = time.perf_counter()
        self.bus.emit(Message(topic, data, {"bench_tag": tag,
                                            "session": {"session_id": "bench"}}))
        if not self.done.wait(10):
            raise RuntimeError(f"no {reply} for {topic} within 10 s")
        return time.perf_counter() - started

    def turn(self, responder: str) -> float:
        return self._exchange("recognizer_loop:utterance", "ovos.utterance.handled",
                              {"utterances": ["hello"], "lang": "en-US",
                               "responder": responder})

    def tick(self) -> None:
        self._exchange("bench.tick", "bench.tick", {})

    def close(self):
        self.bus.close()


NODELAY_SITECUSTOMIZE = """
# bench_ovos_bus.py's baseline bus only: TCP_NODELAY on every socket of ovos-messagebus
from ovos_messagebus.event_handler import MessageBusEventHandler as _Handler
_open = _Handler.open
def open(self, *args, **kwargs):
    self.set_nodelay(True)
    return _open(self, *args, **kwargs)
_Handler.open = open
"""


class Buses:
    """The stock bus and the baseline bus, their answering services; `stop()` ends them."""

    def __init__(self, generation: str, home: str):
        import hub_venvs
        import ovos_hub
        self.home, self.procs = home, []
        self.venv = hub_venvs.ensure_venv(ovos_hub.venv_name(generation))
        self.log = open(os.path.join(home, "processes.log"), "a")
        site = os.path.join(home, "nodelay-site")
        os.makedirs(site)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(NODELAY_SITECUSTOMIZE)
        self.stock = self._bus("stock", [])
        self.baseline = self._bus("baseline", [site])
        self._answer(self.stock, "stock", quick=False)
        self._answer(self.stock, "quick", quick=True)
        self._answer(self.baseline, "stock", quick=False)
        self._answer(self.baseline, "quick", quick=True)     # as many connections as the other

    def _env(self, name: str, path):
        import json
        home = os.path.join(self.home, name)
        return {**os.environ, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(path + [ROOT]),
                **{var: os.path.join(home, sub) for var, sub in
                   (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"),
                    ("XDG_CACHE_HOME", "cache"), ("XDG_STATE_HOME", "state"))}}, home, json

    def _bus(self, name: str, path) -> int:
        from hubs import free_port, wait_listening
        env, home, json = self._env(name, path)
        port = free_port()
        os.makedirs(os.path.join(home, "config", "mycroft"))
        with open(os.path.join(home, "config", "mycroft", "mycroft.conf"), "w") as f:
            json.dump({"websocket": {"host": "127.0.0.1", "port": port, "route": "/core",
                                     "ssl": False, "shared_connection": True,
                                     "max_msg_size": 25}, "log_level": "ERROR"}, f)
        proc = subprocess.Popen([os.path.join(self.venv, "bin", "ovos-messagebus")], env=env,
                                stdout=self.log, stderr=self.log)
        self.procs.append(proc)
        wait_listening(port, 60, proc=proc, what=f"the {name} ovos-messagebus")
        return port

    def _answer(self, port: int, name: str, quick: bool):
        env, _, _ = self._env(f"answer-{port}-{name}", [])
        proc = subprocess.Popen([os.path.join(self.venv, "bin", "python"),
                                 os.path.abspath(__file__), "--answer", str(port), name]
                                + (["--quick"] if quick else []),
                                env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.procs.append(proc)
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError(f"the {name} answering service did not start "
                               f"(see {self.log.name})")

    def stop(self):
        for proc in self.procs[::-1]:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.log.close()


def cases(base: Client, stock: Client, quick: Client):
    """name -> one measured turn, begun after QUIET seconds of silence."""
    def after_traffic(client):
        client.tick()
        return client.turn("stock")

    def back_to_back(client, responder):
        client.turn(responder)
        return client.turn(responder)
    return {
        BASELINE: lambda: back_to_back(base, "stock"),
        "stock bus: stock client, after 250 ms quiet": lambda: stock.turn("stock"),
        "after traffic: stock client": lambda: after_traffic(stock),
        QUICK_AFTER_TRAFFIC: lambda: after_traffic(quick),
        "back to back: stock client, stock answerer": lambda: back_to_back(stock, "stock"),
        "back to back: quick client, stock answerer": lambda: back_to_back(quick, "stock"),
        "back to back: stock client, quick answerer": lambda: back_to_back(stock, "quick"),
        QUICK_BOTH: lambda: back_to_back(quick, "quick"),
    }


BASELINE = "baseline: bus with TCP_NODELAY, back to back"
QUICK_AFTER_TRAFFIC = "after traffic: keep_acks_quick client"
QUICK_BOTH = "back to back: quick client, quick answerer"


def measure(buses: Buses, rounds: int):
    clients = [Client(buses.baseline, quick=False), Client(buses.stock, quick=False),
               Client(buses.stock, quick=True),
               Client(buses.baseline, quick=True)]   # idle: both buses write to 4 clients
    try:
        todo = cases(*clients[:3])
        times = {name: [] for name in todo}
        for case in todo.values():          # one unmeasured round: connections warm
            time.sleep(QUIET)
            case()
        for r in range(rounds):
            order = list(todo)
            random.Random(r).shuffle(order)
            for name in order:
                time.sleep(QUIET)
                times[name].append(todo[name]())
        return times
    finally:
        for client in clients:
            client.close()


def p90(xs):
    return sorted(xs)[int(0.9 * len(xs))]


def report(times, rounds) -> bool:
    from report import Table, ms
    widths = (46, 22, 30, 14)
    table = Table(widths)

    def shown(*cells):               # a row that is not graded
        *padded, last = cells
        print(" ".join(f"{cell:<{width}}" for cell, width in zip(padded, widths, strict=True))
              + f" {last}", flush=True)
    table.header()
    names = list(times)
    base = statistics.median(times[names[0]])
    ok = True
    for name in names:
        med = statistics.median(times[name])
        value = f"{ms(med)} / {ms(p90(times[name]))}"
        ratio = f"{med / base:.2f}x baseline {ms(base)}"
        if name == names[0]:
            shown(name, value, "(median / p90)", "", "(baseline)")
        elif name in (QUICK_AFTER_TRAFFIC, QUICK_BOTH):
            ok &= table.row(name, value, ratio, "<= 1.2x", med <= 1.2 * base)
        else:
            shown(name, value, ratio, "", "(shown)")
    print(f"\n{rounds} turns per case, interleaved; each turn after {QUIET * 1000:.0f} ms "
          "of quiet")
    return ok


def main():
    if sys.argv[1:2] == ["--answer"]:
        answering_service(int(sys.argv[2]), sys.argv[3], "--quick" in sys.argv)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--generation", choices=["5", "4.0"], default="5",
                    help="whose ovos-messagebus: 5 (0.2.1a6) or 4.0 (0.0.10)")
    ap.add_argument("--rounds", type=int, default=50)
    add_option(ap)
    args = ap.parse_args()
    maybe_rerun(args)
    import shutil
    import tempfile

    from ovos_utils.log import LOG
    LOG.set_level("ERROR")
    home = tempfile.mkdtemp(prefix="bench-ovos-bus-")
    buses = None
    try:
        buses = Buses(args.generation, home)
        from importlib.metadata import version
        print(f"ovos-messagebus from {buses.venv}; this process: websocket-client "
              f"{version('websocket-client')}, ovos-bus-client {version('ovos-bus-client')}; "
              f"Linux {os.uname().release}; {os.cpu_count()} CPUs\n")
        ok = report(measure(buses, args.rounds), args.rounds)
    finally:
        if buses is not None:
            buses.stop()
        shutil.rmtree(home, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
