"""Satellites other than ours, each in its own process: hivemind-bus-client's own
HiveMessageBusClient, run with the Python of the OVOS hub's venv of its generation (4.0: the
ovos-hub venv's hivemind-bus-client 0.9.1a1, the line a 4.0 satellite runs; 5: the ovos-hub-5
venv's 1.2.12a1, Noise), as a device that talks to that hub has it.

    sat = StockSatellite(generation, creds)              # a plain satellite (a text client)
    sat = StockSatellite(generation, creds, voice=True)  # plays every speak it gets, as
                                                         # hivemind-voice-sat's ovos-audio does
    sat.say("hello world"); sat.until_handled(); sat.close()

A satellite sends each utterance with the Session of the last message the hub sent it (as a
satellite's OVOS stack keeps it: ovos-bus-client's SessionManager.get stores the Session of
every message it handles): ovos-core keeps a dialog's state (the active skills a get_response
answer is offered to) in the Session, and nothing on the hub keeps it for the satellite
(hivemind-core 4.0 only takes the client's own). A fresh Session every turn loses follow-ups,
whichever plugin serves the hub.

A voice satellite plays each `speak` it receives: it sends `recognizer_loop:audio_output_start`
and, once "played", `recognizer_loop:audio_output_end`, both forwarding the speak's context
(ovos-audio's playback thread does `message.forward(...)`), from a player thread of its own, one
speak after another. Nothing else: whatever else OVOS sends it (a listen request, sounds) is only
recorded, for the tests to look at.

The process (`python tests/stock_satellite.py CONFIG_JSON`) reads one JSON command a line on
stdin ({"emit": MESSAGE}, {"close": true}) and writes one JSON event a line on stdout, prefixed
with EVENT: {"ready": {"session_id": ...}}, {"received": MESSAGE} for every BUS message the hub
sends it, {"sent": MESSAGE} for what its player sent.

A flood (`sat.flood(rate)`, `sat.stop_flood()`, `sat.tally()`) is sent by a thread of the
satellite process itself, and what the hub sends back meanwhile is counted there, not written
out: a benchmark that measured another satellite from its own process would otherwise measure
its own reading of thousands of lines a second under its GIL (benchmarks/bench_ovos_flood.py).

It keeps its identity (and 5.x's Noise static key) in a home of its own, so the user's
~/.config/hivemind stays untouched; one process per access key (5.x pins the key's first Noise
key)."""
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EVENT = "EVENT "
SPEAK_TYPES = ("speak", "ovos.utterance.speak")
AUDIO_START = "recognizer_loop:audio_output_start"
AUDIO_END = "recognizer_loop:audio_output_end"
HANDLED = "ovos.utterance.handled"


# ---- the test side (the test process's own venv) ----

class StockSatellite:
    """A stock satellite process, and everything it received and sent, in order."""

    def __init__(self, generation: str, creds, voice: bool = False, name: str = "stock-sat",
                 ready_timeout: float = 60.0, nice: int = 0):
        sys.path.insert(0, HERE)
        import ovos_hub
        from waiting import wait_until
        self.generation = generation
        self.home = tempfile.mkdtemp(prefix="hm-test-stock-sat-")
        env = {**os.environ, "HOME": self.home, "PYTHONUNBUFFERED": "1",
               **{f"XDG_{d}_HOME": os.path.join(self.home, d.lower())
                  for d in ("CONFIG", "DATA", "CACHE", "STATE")}}
        env.pop("PYTHONPATH", None)
        config = {"key": creds.key, "password": creds.password, "port": creds.port,
                  "voice": voice, "name": name, "home": self.home}
        python = os.path.join(ovos_hub.venv_path(generation), "bin", "python")
        self.log = open(os.path.join(self.home, "satellite.log"), "w")
        niced = ["nice", "-n", str(nice)] if nice else []    # coreutils: every thread niced
        self.proc = subprocess.Popen([*niced, python, os.path.abspath(__file__),
                                      json.dumps(config)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=self.home)
        self.events = []            # ("received" | "sent", message), in the order they came
        self._tally_replies: queue.Queue = queue.Queue()
        self.session_id = None
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        if not wait_until(lambda: self.session_id or self.proc.poll() is not None,
                          ready_timeout) or self.session_id is None:
            self.close()
            raise RuntimeError(f"the stock satellite did not connect: {self.log_tail()}")

    def _read(self):
        for line in self.proc.stdout:
            if not line.startswith(EVENT):
                continue
            event = json.loads(line[len(EVENT):])
            if "tally" in event:
                self._tally_replies.put(event["tally"])
                continue
            with self._lock:
                if "ready" in event:
                    self.session_id = event["ready"]["session_id"]
                for kind in ("received", "sent"):
                    if kind in event:
                        self.events.append((kind, event[kind]))

    def _command(self, command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def emit(self, msg_type, data=None, context=None):
        self._command({"emit": {"type": msg_type, "data": data or {},
                                "context": context or {}}})

    def say(self, utterance: str, lang: str = "en-US"):
        """recognizer_loop:utterance under this satellite's own Session (the last one the
        hub sent it, see the module docstring), as a satellite sends what it heard."""
        self._command({"say": utterance, "lang": lang})

    def flood(self, rate: float = 0.0, refusal_type: str = "", refusal_reason: str = "busy"):
        """Start sending utterances ("flood N") in this satellite's Session as fast as it can
        (`rate`: that many a second); from now on, received messages are counted (`tally`)
        instead of recorded: the ends, and the refusals of `refusal_type` with that reason."""
        self._tally_replies = queue.Queue()
        self._command({"flood": {"rate": rate, "refusal_type": refusal_type,
                                 "refusal_reason": refusal_reason}})

    def stop_flood(self, timeout: float = 30.0) -> int:
        """Stop the flood's sending; how many utterances it sent."""
        self._command({"stop_flood": True})
        return self._tally_replies.get(timeout=timeout)["sent"]

    def tally(self, timeout: float = 30.0) -> dict:
        """{"sent", "handled", "refused"} counted since the flood began."""
        self._command({"tally": True})
        return self._tally_replies.get(timeout=timeout)

    def received(self, since: int = 0):
        with self._lock:
            return [m for kind, m in self.events[since:] if kind == "received"]

    def sent(self, since: int = 0):
        with self._lock:
            return [m for kind, m in self.events[since:] if kind == "sent"]

    def mark(self) -> int:
        with self._lock:
            return len(self.events)

    def until(self, condition, timeout: float = 30.0, since: int = 0):
        """The messages received since `since` once `condition(messages)` holds (or at the
        timeout: the caller's assert shows them)."""
        from waiting import wait_until
        wait_until(lambda: condition(self.received(since)), timeout)
        return self.received(since)

    def until_handled(self, count: int = 1, timeout: float = 30.0, since: int = 0):
        return self.until(lambda got: sum(m["type"] == HANDLED for m in got) >= count,
                          timeout, since)

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()[-chars:]

    def close(self):
        if self.proc.poll() is None:
            try:
                self._command({"close": True})
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def types(messages):
    return [m["type"] for m in messages]


# ---- the satellite process (the hub venv's hivemind-bus-client) ----

class Flood:
    """The satellite process's flood: `say("flood N")` from a thread of its own, as fast as
    it can or `rate` a second, and the counts of what came back since it began; `closes`: how
    often its connection went down meanwhile (`connected()` seen false after true, looked at
    every 50 ms): what was sent and not yet read then is gone with that connection."""

    def __init__(self, say, connected=lambda: True):
        self._say = say
        self._connected = connected
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self.active = False
        self.sent = self.handled = self.refused = self.closes = 0
        self.refusal_type, self.refusal_reason = "", "busy"
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        was_up = True
        while True:
            up = self._connected()
            if was_up and not up and self.active:
                with self._lock:
                    self.closes += 1
            was_up = up
            time.sleep(0.05)

    def start(self, rate=0.0, refusal_type="", refusal_reason="busy"):
        self.stop()
        with self._lock:
            self.sent = self.handled = self.refused = self.closes = 0
            self.refusal_type, self.refusal_reason = refusal_type, refusal_reason
            self.active = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(rate,), daemon=True)
        self._thread.start()

    def _run(self, rate):
        pause = 1.0 / rate if rate > 0 else 0.0
        while not self._stop.is_set():
            self._say(f"flood {self.sent}")
            self.sent += 1
            if pause:
                self._stop.wait(pause)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def counts(self, msg_type, data) -> bool:
        """Count a received message if a flood began (True: counted, not to be written)."""
        if not self.active:
            return False
        with self._lock:
            if msg_type == HANDLED:
                self.handled += 1
            elif msg_type == self.refusal_type and data.get("reason") == self.refusal_reason:
                self.refused += 1
        return True

    def tally(self):
        with self._lock:
            return {"sent": self.sent, "handled": self.handled, "refused": self.refused,
                    "closes": self.closes}


def _print_event(lock, event):
    with lock:
        sys.stdout.write(EVENT + json.dumps(event, default=str) + "\n")
        sys.stdout.flush()


def main():
    from hivemind_bus_client.client import HiveMessageBusClient
    from hivemind_bus_client.identity import NodeIdentity
    from hivemind_bus_client.message import HiveMessageType
    from json_database import JsonStorage
    from ovos_bus_client.message import Message
    from ovos_utils.log import LOG
    LOG.set_level("WARNING")
    config = json.loads(sys.argv[1])
    out = threading.Lock()
    identity = NodeIdentity(identity_file=JsonStorage(os.path.join(config["home"],
                                                                   "_identity.json")))
    client = HiveMessageBusClient(key=config["key"], password=config["password"],
                                  host="ws://127.0.0.1", port=config["port"],
                                  useragent=config["name"], identity=identity)
    speeches = queue.Queue()
    kept = {}      # the Session of this satellite's last message from the hub
    flood = Flood(lambda text: say(text, "en-US"), client.handshake_event.is_set)

    def keep_session(message):
        session = message.context.get("session")
        if isinstance(session, dict) and session.get("session_id") == client.session_id:
            kept["session"] = session

    def play():
        """ovos-audio's part in a voice satellite: each speak played in turn, its start and
        end told to the hub with the speak's context."""
        while True:
            speak = speeches.get()
            if speak is None:
                return
            for msg_type in (AUDIO_START, AUDIO_END):
                message = speak.forward(msg_type)
                client.emit(message)
                _print_event(out, {"sent": {"type": msg_type, "data": message.data,
                                            "context": message.context}})

    def on_bus(hive_message):
        """A BUS message from the hub (on_mycroft would also hear the library's local
        echo of every message this satellite emits)."""
        message = hive_message.payload
        if isinstance(message, dict):
            message = Message(message.get("type") or message.get("msg_type"),
                              message.get("data") or {}, message.get("context") or {})
        elif isinstance(message, str):
            message = Message.deserialize(message)
        if flood.counts(message.msg_type, message.data):
            keep_session(message)
            return
        _print_event(out, {"received": {"type": message.msg_type, "data": message.data,
                                        "context": dict(message.context)}})
        keep_session(message)
        if config["voice"] and message.msg_type in SPEAK_TYPES:
            speeches.put(message)

    client.connect()
    if not client.handshake_event.is_set():
        sys.exit("no handshake with the hub (see the log above)")
    client.on(HiveMessageType.BUS, on_bus)
    player = threading.Thread(target=play, daemon=True)
    player.start()
    _print_event(out, {"ready": {"session_id": client.session_id}})

    def say(text, lang):
        session = kept.get("session") or {"session_id": client.session_id, "lang": lang}
        client.emit(Message("recognizer_loop:utterance", {"utterances": [text], "lang": lang},
                            {"session": session}))

    for line in sys.stdin:
        command = json.loads(line)
        if command.get("close"):
            break
        if "say" in command:
            say(command["say"], command.get("lang") or "en-US")
        elif "flood" in command:
            flood.start(**command["flood"])
        elif "stop_flood" in command:
            flood.stop()
            _print_event(out, {"tally": flood.tally()})
        elif "tally" in command:
            _print_event(out, {"tally": flood.tally()})
        else:
            wire = command["emit"]
            client.emit(Message(wire["type"], wire["data"], wire["context"]))
    flood.stop()
    speeches.put(None)
    client.close()


if __name__ == "__main__":
    main()
