"""The stable HiveMind + OVOS install, minus ovos-core's seconds: hivemind-core 4.0.0 with the
stock hivemind-ovos-agent-plugin 0.1.0 (`hivemind-core listen`), a genuine ovos-messagebus, and
an answering service on that bus that replies to every utterance at once, as a skill would.

    hub = StockOVOSHub().start(); creds = hub.add_client(); ...; hub.cleanup()
    python tests/stock_hub.py --answer BUS_PORT [--quick]   the answering service (the hub venv
                                                            runs it); --quick: with
                                                            keep_acks_quick on its bus socket

All three run from the cached "hub-4.0" venv (tests/hub_venvs.py), each with its own log in the
hub's home; `generation="5"`: from the "ovos-hub-5" venv instead (hivemind-core 5.3.10a1 and
its ovos-messagebus; the stock plugin there is 0.5.3a1). `StockOVOSHub(plugin="ovos-mode")`
puts our plugin in its OVOS mode in front of the same bus instead of the stock one;
`agent_protocol` any other plugin.
"""
import json
import os
import signal
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hub_venvs  # noqa: E402
from spawned import record, stop_all  # noqa: E402

# what the stock 4.0 plugin's races leave in a hub log: tornado's iostream AssertionError and
# "Uncaught exception" (frames written off the IO loop), "dictionary changed size" (the client
# table iterated on the bus thread)
STOCK_PLUGIN_RACES = ("dictionary changed size", "AssertionError", "Uncaught exception")

STOCK_PLUGIN = "hivemind-ovos-agent-plugin"
OUR_PLUGIN = "hivemind-chat-agent-plugin"
PLUGINS = ("stock", "ovos-mode")


def answering_service(port: int, quick: bool = False) -> None:
    """Answers every `recognizer_loop:utterance` on the OVOS bus like a skill would: `speak`
    ("you said ..."; "wait N" is answered N seconds later), then `ovos.utterance.handled`,
    both with Message.reply, so the context
    (destination = the satellite's peer, session, the client's turn tags) goes back to the
    HiveMind agent plugin; and `mycroft.skills.is_ready`, as ovos-core's skill manager does.
    `quick`: keep_acks_quick on its bus socket (hub/bus_socket.py), so its own delayed ACK
    never holds the bus's next frame to it (benchmarks/bench_ovos_mode.py: back-to-back
    turns without the answering side's 40 ms; ovos-core's connection is stock)."""
    from ovos_bus_client import MessageBusClient
    from ovos_utils.log import LOG
    from pyee import EventEmitter
    LOG.set_level("ERROR")

    class Bus(MessageBusClient):
        def on_open(self, *args):
            if quick:
                from hivemind_chat_agent.hub.bus_socket import keep_acks_quick
                if not keep_acks_quick(self.client.sock):
                    raise RuntimeError("keep_acks_quick could not be applied")
            super().on_open(*args)
    bus = Bus(host="127.0.0.1", port=port, emitter=EventEmitter())

    def answer(message, utterance):
        lang = (message.context.get("session") or {}).get("lang") or "en-US"
        bus.emit(message.reply("speak", {"utterance": f"you said {utterance}",
                                         "expect_response": False, "lang": lang,
                                         "meta": {"skill": "test.echo"}}))
        bus.emit(message.reply("ovos.utterance.handled", {}))

    def on_utterance(message):
        utterance = (message.data.get("utterances") or [""])[0]
        words = str(utterance).split()
        if len(words) == 2 and words[0] == "wait":     # "wait 2": answered 2 s later
            threading.Timer(float(words[1]), answer, (message, utterance)).start()
        else:
            answer(message, utterance)

    bus.on("recognizer_loop:utterance", on_utterance)
    bus.run_in_thread()
    if not bus.connected_event.wait(30):
        print("the answering service could not connect", flush=True)
        sys.exit(1)
    # answers mycroft.skills.is_ready as ovos-core's skill manager does, with ovos-utils' own
    # ProcessStatus, ready once its handlers are on (the OVOS mode waits for it)
    from ovos_utils.process_utils import ProcessStatus
    status = ProcessStatus("skills", bus=bus)
    status.set_ready()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("READY", flush=True)
    stop.wait()
    bus.close()


class StockOVOSHub:
    def __init__(self, agent_protocol=None, plugin="stock", quick_answerer=False,
                 settings=None, generation="4.0", hub_venv=None, log_level="WARNING"):
        """`settings`: more keys of our plugin's server.json section (plugin "ovos-mode");
        `log_level`: mycroft.conf's, for the hub, the bus and the answering service alike;
        `hub_venv`: another venv of tests/hub_venvs.py for hivemind-core alone (e.g.
        "http-hub-5", with hivemind-http-protocol), the bus and its answering service still
        from the generation's own."""
        from hubs import HubProcess, free_port
        if plugin not in PLUGINS:
            raise ValueError(f"plugin is one of {PLUGINS}, not {plugin!r}")
        if generation not in ("4.0", "5"):
            raise ValueError(f"generation is 4.0 or 5, not {generation!r}")
        self.generation = generation
        venv_name = "hub-4.0" if generation == "4.0" else "ovos-hub-5"
        self.venv = hub_venvs.ensure_venv(venv_name)
        self.bus_port = free_port()
        self.plugin = plugin
        self.quick_answerer = quick_answerer     # answering_service(quick=...)
        if plugin == "ovos-mode":
            default = {"module": OUR_PLUGIN, OUR_PLUGIN: {
                "mode": "ovos", "bus": f"ws://127.0.0.1:{self.bus_port}/core",
                **(settings or {})}}
        else:
            default = {"module": STOCK_PLUGIN,
                       STOCK_PLUGIN: {"host": "127.0.0.1", "port": self.bus_port}}
        self.agent_protocol = agent_protocol or default
        self.hub = HubProcess(self.agent_protocol, generation=generation,
                              venv=hub_venv or (None if generation == "4.0" else venv_name))
        self.home = self.hub.home
        self.procs = []
        config = os.path.join(self.home, "config", "mycroft", "mycroft.conf")
        os.makedirs(os.path.dirname(config), exist_ok=True)
        with open(config, "w") as f:   # the bus's port, for ovos-messagebus (same XDG home)
            json.dump({"websocket": {"host": "127.0.0.1", "port": self.bus_port,
                                     "route": "/core", "ssl": False,
                                     "shared_connection": True, "max_msg_size": 25},
                       "log_level": log_level}, f)

    @property
    def port(self) -> int:
        return self.hub.port

    def _spawn(self, name: str, cmd):
        log = open(os.path.join(self.home, f"{name}.log"), "a")
        proc = subprocess.Popen(cmd, env=self.hub.env, stdout=subprocess.PIPE, stderr=log,
                                text=True, start_new_session=True)
        self.procs.append((proc, log))
        record(proc, f"{self.home} ({name})", group=True)
        return proc, log

    def start(self) -> "StockOVOSHub":
        from hubs import wait_listening
        try:
            bus, _ = self._spawn("messagebus", [os.path.join(self.venv, "bin", "ovos-messagebus")])
            threading.Thread(target=_drain, args=(bus, self.procs[-1][1]), daemon=True).start()
            wait_listening(self.bus_port, 60, proc=bus, what="ovos-messagebus")
            answer, log = self._spawn("answering", [os.path.join(self.venv, "bin", "python"),
                                                    os.path.abspath(__file__), "--answer",
                                                    str(self.bus_port)]
                                       + (["--quick"] if self.quick_answerer else []))
            for line in answer.stdout:     # whatever it logs first, then READY
                if line.strip() == "READY":
                    break
                log.write(line)
            else:
                raise RuntimeError(f"the answering service did not start (see {log.name})")
            threading.Thread(target=_drain, args=(answer, log), daemon=True).start()
            self.hub.start()
        except Exception:
            self.cleanup()
            raise
        return self

    def add_client(self, **kw):
        return self.hub.add_client(**kw)

    def logs(self) -> str:
        return self.hub.logs()

    def cleanup(self):
        self.hub.cleanup()
        stop_all([proc for proc, _log in reversed(self.procs)], group=True)  # SIGKILL 10 s on
        for _proc, log in self.procs:
            log.close()
        self.procs = []


def _drain(proc, log):
    try:
        for line in proc.stdout:
            log.write(line)
    except (ValueError, OSError):
        pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["--answer"]:
        answering_service(int(sys.argv[2]), quick="--quick" in sys.argv[3:])
