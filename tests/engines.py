"""Chat engines for the hub-side tests, loaded by hivemind-core as "engines:ScriptEngine".

Commands (first word): hello | history | count N | slow N SECONDS | talk N SECONDS | stops |
talking | answering | wait SECONDS | raise | hang SECONDS | empty | remember WORDS | recall |
whoami | lang | units | note WORDS | notes | asked; anything else is echoed. "note"/"notes" keep
their words in the turn's OVOS Session (intent context), as skills keep their state, instead of
in the engine.

"talk" is a long answer that a satellite's stop ends: the engine notes (kind, time.monotonic())
when its generator is closed ("closed"), when `stop_session` is called ("stop_session") and when
the answer returned because of it ("returned"), and
"stops" answers that list as JSON (CLOCK_MONOTONIC is one clock for every process here);
"asked" every utterance the engine was run with before it, as JSON (what a front let reach
the hub); "talking" how many "talk" answers are going on now, "answering" how many answers of
any kind besides itself (a test waits for that to reach 0 instead of sleeping until an answer
must have ended).
"""
import json
import os
import threading
import time

from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole


class ScriptEngine(ChatEngine):
    def __init__(self, config=None):
        super().__init__(config)
        self.memory = {}
        self.lock = threading.Lock()
        self.stops = []                 # (kind, monotonic time) of every stop seen
        self.asked = []                 # every utterance it was run with, in order
        self.talking = {}               # session -> Event set by stop_session
        self.answering = 0              # answers whose generator has not ended yet

    def stop_session(self, session_id):
        with self.lock:
            self.stops.append(("stop_session", time.monotonic()))
            talking = self.talking.get(session_id)
        if talking is not None:
            talking.set()

    def continue_chat(self, messages, session_id="default", lang=None, units=None, tools=None):
        return AgentMessage(MessageRole.ASSISTANT,
                            "\n".join(self.stream_sentences(messages, session_id, lang, units)))

    def stream_sentences(self, messages, session_id="default", lang=None, units=None):
        with self.lock:
            self.answering += 1
        try:
            yield from self._answer(messages, session_id, lang, units)
        finally:
            with self.lock:
                self.answering -= 1

    def _answer(self, messages, session_id, lang, units):
        text = messages[-1].content
        self.asked.append(text)
        words = text.split()
        cmd, args = (words[0].lower(), words[1:]) if words else ("", [])
        if cmd == "hello":
            yield "hello there"
        elif cmd == "history":     # what came before this utterance, as the engine got it
            yield json.dumps([[getattr(m.role, "value", m.role), m.content]
                              for m in messages[:-1]])
        elif cmd == "count":
            for i in range(int(args[0])):
                yield f"sentence {i + 1}"
        elif cmd == "slow":
            for i in range(int(args[0])):
                time.sleep(float(args[1]))
                yield f"slow sentence {i + 1}"
        elif cmd == "talk":
            stop = threading.Event()
            with self.lock:
                self.talking[session_id] = stop
            try:
                for i in range(int(args[0])):
                    if stop.wait(float(args[1])):
                        with self.lock:
                            self.stops.append(("returned", time.monotonic()))
                        return
                    yield f"talk sentence {i + 1}"
            except GeneratorExit:
                with self.lock:
                    self.stops.append(("closed", time.monotonic()))
                raise
            finally:
                with self.lock:
                    if self.talking.get(session_id) is stop:
                        del self.talking[session_id]
        elif cmd == "stops":
            with self.lock:
                yield json.dumps(self.stops)
        elif cmd == "asked":
            with self.lock:
                yield json.dumps(self.asked[:-1])
        elif cmd == "talking":
            with self.lock:
                yield str(len(self.talking))
        elif cmd == "answering":
            with self.lock:
                yield str(self.answering - 1)
        elif cmd == "wait":
            time.sleep(float(args[0]))
            yield "done waiting"
        elif cmd == "raise":
            raise RuntimeError("engine exploded")
        elif cmd == "hang":
            time.sleep(float(args[0]))
            yield "too late"
        elif cmd == "empty":
            return
        elif cmd == "remember":
            with self.lock:
                self.memory[session_id] = " ".join(args)
            yield "I will remember that"
        elif cmd == "recall":
            with self.lock:
                value = self.memory.get(session_id)
            yield f"you said {value}" if value else "I remember nothing"
        elif cmd == "note":
            from ovos_bus_client.session import SessionManager
            sess = SessionManager.sessions[session_id]
            key = f"Note{len(notes_in(sess))}"    # one value per key in ovos-bus-client 2.x
            sess.context.inject_context({"data": [[" ".join(args), key]], "key": key,
                                         "confidence": 1.0})
            yield "noted"
        elif cmd == "notes":
            from ovos_bus_client.session import SessionManager
            notes = notes_in(SessionManager.sessions[session_id])
            yield f"notes: {', '.join(notes)}" if notes else "no notes"
        elif cmd == "whoami":
            yield f"session {session_id}"
        elif cmd == "lang":
            yield f"language {lang}"
        elif cmd == "units":
            yield f"units {units}"
        else:
            yield f"you said {text}"


def notes_in(sess):
    """The notes kept in a Session's intent context, newest first: ovos-bus-client 2.x keeps
    them in `intent_context` (one value per key), 1.x as frames carrying the key."""
    context = getattr(sess, "intent_context", None)
    if isinstance(context, dict):
        found = [(k, v.get("value")) for k, v in context.items()
                 if k.startswith("Note") and isinstance(v, dict)]
    else:
        found = [(e.get("key"), e["data"][0][0]) for frame, _ in sess.context.frame_stack
                 for e in frame.entities if str(e.get("key", "")).startswith("Note")]
    return [value for _, value in sorted(found, key=lambda kv: int(kv[0][4:] or 0),
                                         reverse=True)]


class RunLogEngine(ScriptEngine):
    """ScriptEngine that appends `<pid> <utterance>` to the file `ran_log` (engine_config) as
    it starts each answer: what ran where survives its replica's restart (tests/test_rolling_
    restart.py counts each turn's runs from it, across processes)."""

    def __init__(self, config=None):
        super().__init__(config)
        self.ran_log = (config or {}).get("ran_log") or os.devnull

    def _answer(self, messages, session_id, lang, units):
        with open(self.ran_log, "a") as f:      # one short append: whole lines, any process
            f.write(f"{os.getpid()} {messages[-1].content}\n")
        yield from super()._answer(messages, session_id, lang, units)

