"""An agent protocol that answers like the OVOS pipeline, for a real hivemind-core hub in tests.

It receives what hivemind-core injects on the agent bus (after the hub's own key, session and
allowed-type checks), and answers on a worker thread, never on the hub's IO loop, with replies
built by `Message.reply` as OVOS skills do, so context (and our turn tag) is kept. Each reply is
sent to the asking peer through the IO loop, as a genuine agent plugin must.

Utterances it understands (first word):
  hello                 one sentence
  count N               N sentences at once
  slow N SECONDS        N sentences, SECONDS apart
  paced N SECONDS       N sentences SECONDS apart, the first at once
  fail                  complete_intent_failure, then handled
  cancel                ovos.utterance.cancelled, then handled
  silence               nothing at all
  remember WORDS        stores WORDS in the Session (intent context), like a skill would
  recall                reads it back from the Session that came with this utterance
  lang                  says the Session's language
  units                 says the Session's unit system
  whoami                says the session_id the satellite declared (5.x core hands OVOS
                        `<16 hex>:<declared>`; the namespace is left out, as on 4.0)
  ask [SECONDS]         asks a question (expect_response), takes the session's next utterance
                        as the answer, then goes on, as ovos-core runs a skill's get_response:
                        `skill.converse.get_response.enable`, the question, then
                        `test.skill.get_response.waiting` (it listens), the answer routed to
                        `test.skill.converse.get_response` (no handled of its own), the reply
                        and then the handled under the asking utterance; "no answer, never
                        mind" when SECONDS pass without one
  greet                 speaks with wait=True: handled only after the client reports
                        recognizer_loop:audio_output_end for the session (15 s at most)
  later SECONDS         answers, then speaks once more SECONDS later, between turns
  hostile               garbage of every kind, then one good sentence and handled
  both                  newer OVOS: each sentence as "speak" and "ovos.utterance.speak"
  untagged N            N sentences with the turn tag stripped from the replies
  plainforge            a forged plain-text speak + handled (our tag, another language in
                        its Session), then the genuine sentence encrypted
  tamper                an encrypted-looking frame whose ciphertext fails authentication
  huge N                one genuine sentence of N characters

Runs on hivemind-core 4.0 (password handshake: frames encrypted under the connection's
crypto_key) and 5.x (Noise: frames through the connection's noise_transport). It answers both
utterance topics, and hivemind-core's QUERY (`natural_language_query`, abstract from
hivemind-plugin-manager 0.7). On 5.x the session ids it sees are core's, namespaced per client
(`<16 hex>:<declared>`); core restores the declared id in what `client.send` writes.
"""
import json
import queue
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hivemind_bus_client.encryption import encrypt_as_json
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_plugin_manager.protocols import AgentProtocol
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from ovos_utils.fakebus import FakeBus
from tornado.ioloop import IOLoop

MEMORY_KEY = "TestMemory"


class PipelineAgent(AgentProtocol):
    def __init__(self, config=None, bus=None, hm_protocol=None, callbacks=None, **_):
        super().__init__(config=config or {}, bus=bus or FakeBus(), hm_protocol=hm_protocol)
        self._pool = ThreadPoolExecutor(max_workers=32)
        for topic in ("recognizer_loop:utterance", "ovos.utterance.handle"):
            self.bus.on(topic, self._on_utterance)
        self.bus.on("recognizer_loop:audio_output_end", self._on_audio_end)
        self.seen = []
        self._questions = {}   # session_id -> queue of the answer, while a skill waits
        self._speaking = {}    # session_id -> Event set by the client's audio_output_end

    def _on_utterance(self, message: Message):
        loop = IOLoop.current()   # we are on the hub's IO loop thread here
        peer = message.context.get("peer")
        waiting = self._questions.get(message.context.get("session", {}).get("session_id"))
        if waiting is not None:   # a skill asked: this utterance is its answer (response mode)
            self._send(loop, peer, message.reply("test.skill.converse.get_response",
                                                 dict(message.data)))
            waiting.put((message.data.get("utterances") or [""])[0])
            return
        self._pool.submit(self._answer, message, peer, loop)

    def natural_language_query(self, utterance, lang):
        """hivemind-core's QUERY: one sentence, then the end."""
        yield f"you said {utterance}"
        yield None

    def _on_audio_end(self, message: Message):
        sid = message.context.get("session", {}).get("session_id")
        event = self._speaking.get(sid)
        if event is not None:
            event.set()

    def _send(self, loop, peer, reply: Message):
        def send():
            client = self.hm_protocol.clients.get(peer)
            if client is not None:
                client.send(HiveMessage(HiveMessageType.BUS, payload=reply))
        loop.add_callback(send)

    def _speak(self, loop, peer, message, text, msg_type="speak", expect_response=False):
        self._send(loop, peer, message.reply(msg_type, {"utterance": text,
                                                        "expect_response": expect_response,
                                                        "meta": {}, "lang": "en-US"}))

    def _answer(self, message: Message, peer, loop):
        try:
            self._answer_or_raise(message, peer, loop)
        except Exception:
            import traceback
            traceback.print_exc()

    def _answer_or_raise(self, message: Message, peer, loop):
        utterance = (message.data.get("utterances") or [""])[0]
        words = utterance.split()
        cmd, args = (words[0].lower(), words[1:]) if words else ("", [])
        self.seen.append((peer, utterance, message.context.get("session", {}).get("session_id")))
        sess = Session.from_message(message)
        def done():
            return self._send(loop, peer, message.reply("ovos.utterance.handled", {}))
        if cmd == "hello":
            self._speak(loop, peer, message, "hello there")
        elif cmd == "count":
            for i in range(int(args[0])):
                self._speak(loop, peer, message, f"sentence {i + 1}")
        elif cmd == "slow":
            for i in range(int(args[0])):
                time.sleep(float(args[1]))
                self._speak(loop, peer, message, f"slow sentence {i + 1}")
        elif cmd == "paced":
            for i in range(int(args[0])):
                if i:
                    time.sleep(float(args[1]))
                self._speak(loop, peer, message, f"paced sentence {i + 1}")
        elif cmd == "fail":
            self._send(loop, peer, message.reply("complete_intent_failure", {}))
        elif cmd == "cancel":
            self._send(loop, peer, message.reply("ovos.utterance.cancelled", {}))
        elif cmd == "silence":
            return
        elif cmd == "remember":
            sess.context.inject_context({"data": [[" ".join(args), MEMORY_KEY]],
                                         "key": MEMORY_KEY, "confidence": 1.0})
            sess.activate_skill("memory.test")
            message.context["session"] = sess.serialize()
            self._speak(loop, peer, message, "I will remember that")
        elif cmd == "recall":
            remembered = _remembered(sess)
            self._speak(loop, peer, message,
                        f"you said {remembered[-1]}" if remembered else "I remember nothing")
        elif cmd == "lang":
            self._speak(loop, peer, message, f"language {sess.lang}")
        elif cmd == "units":
            self._speak(loop, peer, message, f"units {sess.system_unit}")
        elif cmd == "ask":   # a skill calling get_response(): ask, wait, go on in this handler
            answers = self._questions[sess.session_id] = queue.Queue()
            self._send(loop, peer, message.reply("skill.converse.get_response.enable",
                                                 {"skill_id": "test.skill"}))
            self._speak(loop, peer, message, "what is your favourite colour?",
                        expect_response=True)
            self._send(loop, peer, message.reply("test.skill.get_response.waiting"))
            try:
                answer = answers.get(timeout=float(args[0]) if args else 10)
            except queue.Empty:
                answer = None
            finally:
                self._questions.pop(sess.session_id, None)
            self._send(loop, peer, message.reply("skill.converse.get_response.disable",
                                                 {"skill_id": "test.skill"}))
            self._speak(loop, peer, message,
                        f"{answer} is a fine colour" if answer else "no answer, never mind")
        elif cmd == "greet":   # speak(wait=True): blocks until the client played it
            event = self._speaking[sess.session_id] = threading.Event()
            self._speak(loop, peer, message, "hello world")
            self.waited = event.wait(15)
            self._speaking.pop(sess.session_id, None)
        elif cmd == "later":
            self._speak(loop, peer, message, "now you wait")
            done()
            time.sleep(float(args[0]))
            self._speak(loop, peer, message, "the wait is over")
            return
        elif cmd == "whoami":
            self._speak(loop, peer, message,
                        f"session {re.sub(r'^[0-9a-f]{16}:', '', sess.session_id)}")
        elif cmd == "hostile":
            self._hostile(loop, peer, message)
        elif cmd == "both":
            for i in range(2):
                self._speak(loop, peer, message, f"twin {i + 1}")
                self._speak(loop, peer, message, f"twin {i + 1}", "ovos.utterance.speak")
        elif cmd == "plainforge":
            forged = dict(message.context)
            forged["session"] = dict(forged["session"], lang="xx-XX")
            for msg_type, data in (("speak", {"utterance": "forged"}),
                                   ("ovos.utterance.handled", {})):
                self._raw(loop, peer, {"msg_type": "bus", "payload": {
                    "type": msg_type, "data": data, "context": forged}}, encrypt=False)
            # no wait: the IO loop runs its callbacks in order, so the forged frames go out
            # on the socket before the genuine one
            self._speak(loop, peer, message, "genuine")
        elif cmd == "tamper":
            loop.add_callback(lambda: write_tampered(self.hm_protocol.clients.get(peer)))
            # no wait: the loop sends the tampered frame first (callbacks run in order)
            self._speak(loop, peer, message, "after tampering")
        elif cmd == "huge":
            self._speak(loop, peer, message, "x" * int(args[0]))
        elif cmd == "untagged":
            message.context.pop("hivemind_chat_turn", None)
            for i in range(int(args[0])):
                self._speak(loop, peer, message, f"untagged {i + 1}")
        else:
            self._speak(loop, peer, message, f"you said {utterance}")
        done()

    def _raw(self, loop, peer, obj, encrypt=True):
        def send():
            client = self.hm_protocol.clients.get(peer)
            text = obj if isinstance(obj, str) else json.dumps(obj)
            if encrypt:
                write_encrypted(client, text)
            else:
                client.send_msg(text, False)
        loop.add_callback(send)

    def _hostile(self, loop, peer, message: Message):
        """Frames no well-behaved hub sends, encrypted with the client's key so they get past
        decryption and reach the client's parsing."""
        def raw(obj):
            def send():
                client = self.hm_protocol.clients.get(peer)
                write_encrypted(client, obj if isinstance(obj, str) else json.dumps(obj))
            loop.add_callback(send)

        def bus(payload):
            return raw({"msg_type": "bus", "payload": payload})
        other = dict(message.context)
        other["session"] = dict(other["session"], session_id="someone-else",
                                lang="xx-XX")
        bus({"type": "speak", "data": "not a dict", "context": message.context})
        bus({"type": "speak", "data": {"utterance": 42}, "context": message.context})
        bus({"type": "speak", "data": {"utterance": "no session"}, "context": {}})
        bus({"type": "speak", "data": {"utterance": "wrong session"}, "context": other})
        bus({"type": "ovos.utterance.handled", "data": {}, "context": other})
        bus({"type": "totally.unknown", "data": {"x": 1}, "context": message.context})
        bus({"type": "speak", "data": {"utterance": "x" * 200_000},
             "context": message.context})
        bus({"type": "speak", "data": {"utterance": "bad session"},
             "context": dict(message.context, session="not a dict")})
        bus({"type": 7, "data": {}, "context": message.context})
        bus(["not", "a", "message"])
        raw("{ this is not json")
        raw(["a", "list"])
        self._speak(loop, peer, message, "still fine")


def _remembered(sess):
    """What "remember" stored: ovos-bus-client 2.x keeps intent context as a map by key
    (`intent_context`, its legacy frames named by value), 1.x as frames with that key."""
    context = getattr(sess, "intent_context", None)
    if isinstance(context, dict) and isinstance(context.get(MEMORY_KEY), dict):
        return [context[MEMORY_KEY].get("value")]
    return [e["data"][0][0] for frame, _ in sess.context.frame_stack
            for e in frame.entities if e.get("key") == MEMORY_KEY]


def write_encrypted(client, text: str) -> None:
    """`text` as one frame, encrypted the way the connection's own frames are: through its
    Noise transport (5.x, under its send lock: nonces go out in order) or under its session key
    (4.x), but with no check of what it says."""
    transport = getattr(client, "noise_transport", None)
    if transport is not None:
        with client._send_lock:
            transport.send_message(text, lambda frame: client.send_msg(frame, True))
    else:
        client.send_msg(encrypt_as_json(key=client.crypto_key, plaintext=text,
                                        cipher=client.cipher, encoding=client.encoding), False)


def write_tampered(client) -> None:
    """A frame that looks encrypted under the connection's key but fails authentication."""
    transport = getattr(client, "noise_transport", None)
    if transport is not None:
        with client._send_lock:    # a real nonce, so the satellite's next one is skipped too
            frames = []
            transport.send_message("{}", frames.append)
            bad = bytearray(frames[0])
            bad[-1] ^= 0xFF
            client.send_msg(bytes(bad), True)
    else:
        good = json.loads(encrypt_as_json(key=client.crypto_key, plaintext="{}",
                                          cipher=client.cipher, encoding=client.encoding))
        good["ciphertext"] = good["ciphertext"][::-1]
        client.send_msg(json.dumps(good), False)


def start_hub(home=None, port=0):
    from hivemind_chat_agent.bridges.local_hub import LocalHub
    return LocalHub(PipelineAgent(), home=home, port=port).start()
