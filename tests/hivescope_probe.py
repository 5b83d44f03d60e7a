"""Run inside the `hivescope` venv (tests/hub_venvs.py) by tests/test_hivescope.py: our hub
plugin behind hivescope's MasterNode, satellites as hivescope's SatelliteNode, everything
in-process on this script's threads, no IO loop anywhere (as hivemind-mqtt-protocol's thread
has none). Prints one JSON line: per scenario, what each satellite's OVOS bus received.

    python hivescope_probe.py   (with this checkout's package_path() and tests/ on PYTHONPATH)
"""
import json
import threading

from engines import ScriptEngine
from hivescope import MasterNode, SatelliteNode
from ovos_bus_client.message import Message

from hivemind_chat_agent.hub.protocol import ChatAgentProtocol

ALLOWED = ["recognizer_loop:utterance", "mycroft.stop"]
WAIT = 30.0     # seconds a scenario waits for its turn's end: a bound, never a pause


class Listener:
    """What one satellite's OVOS bus got: (type, text or reason, thread) per message."""

    def __init__(self, satellite):
        self.satellite = satellite
        self.heard = []
        self.ended = threading.Event()
        bus = satellite.internal_bus
        bus.on("speak", lambda m: self._note("speak", m.data.get("utterance")))
        bus.on("complete_intent_failure", lambda m: self._note("failure", m.data.get("reason")))
        bus.on("ovos.utterance.handled", lambda m: self._note("handled", None))

    def _note(self, kind, detail):
        self.heard.append([kind, detail, threading.current_thread().name])
        if kind == "handled":
            self.ended.set()

    def turn(self, text, until_speech=False):
        """Say `text`; return what was heard until its end (or, `until_speech`, return as
        soon as the first sentence arrived, the turn still going)."""
        self.heard, self.ended = [], threading.Event()
        self.satellite.send(Message("recognizer_loop:utterance",
                                    {"utterances": [text], "lang": "en-US"}))
        if until_speech:
            for _ in range(int(WAIT * 20)):
                if self.heard:
                    break
                self.ended.wait(0.05)
            return list(self.heard)
        self.ended.wait(WAIT)
        return list(self.heard)


def main():
    engine = ScriptEngine()
    agent = ChatAgentProtocol(config={"timeout": 2}, engine=engine)
    master = MasterNode.create("hub", agent_protocol=agent)
    satellites = {}
    for name in ("kitchen", "garage"):
        satellite = SatelliteNode.create(name)
        satellite.connect(master, allowed_types=ALLOWED)
        satellites[name] = Listener(satellite)
    kitchen, garage = satellites["kitchen"], satellites["garage"]
    out = {"greeting": kitchen.turn("count 2")}
    out["remembered"] = kitchen.turn("remember the red door")
    out["other_satellite"] = garage.turn("recall")
    out["same_satellite"] = kitchen.turn("recall")
    out["timed_out"] = kitchen.turn("hang 6")          # beyond the plugin's 2 s timeout
    out["talking"] = garage.turn("talk 50 0.2", until_speech=True)
    garage.ended = threading.Event()
    garage.satellite.send(Message("mycroft.stop", {}))
    garage.ended.wait(WAIT)
    out["stopped"] = list(garage.heard)
    out["after_stop"] = garage.turn("hello")
    out["main_thread"] = threading.current_thread().name
    agent.shutdown()
    for listener in satellites.values():
        listener.satellite.cleanup()
    master.cleanup()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
