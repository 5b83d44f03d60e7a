"""Session bookkeeping and configuration, without sockets."""
import json

import pytest
from ovos_bus_client.session import Session, SessionManager

from hivemind_chat_agent.client.config import ClientConfig, default_session_id_for
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.errors import ConfigurationError

BASE = {"host": "127.0.0.1", "key": "k" * 32, "password": "p" * 32}


def test_default_maps_to_a_stable_private_id():
    book = SessionBook(default_session_id_for("abc"))
    assert book.resolve("default") == book.resolve(None) == default_session_id_for("abc")
    assert default_session_id_for("abc") == default_session_id_for("abc")
    assert default_session_id_for("abc") != default_session_id_for("abd")
    assert "abc" not in default_session_id_for("abc")
    assert book.resolve("kitchen") == "kitchen"


def test_for_turn_creates_then_reuses_and_applies_overrides():
    book = SessionBook("d", site_id="livingroom")
    SessionManager.sessions.pop("sb-1", None)
    s = book.for_turn("sb-1", lang="pt-PT", units="imperial")
    assert s.session_id == "sb-1" and s.lang == "pt-PT" and s.system_unit == "imperial"
    assert s.site_id == "livingroom"
    assert SessionManager.sessions["sb-1"] is s
    s.activate_skill("skill.x")
    again = book.for_turn("sb-1")
    assert again is s and again.lang == "pt-PT"


def test_absorb_refreshes_only_its_own_session():
    SessionManager.sessions.pop("sb-2", None)
    SessionManager.sessions.pop("sb-3", None)
    changed = Session("sb-2")
    changed.activate_skill("weather.skill")
    book = SessionBook("d")
    assert book.absorb("sb-2", changed.serialize())
    assert SessionManager.sessions["sb-2"].active_skills[0][0] == "weather.skill"
    assert not book.absorb("sb-3", changed.serialize())   # id mismatch
    assert "sb-3" not in SessionManager.sessions
    assert not book.absorb("sb-2", {"session_id": "sb-2", "active_skills": "garbage"})


def test_a_fresh_session_sends_only_the_conversation_and_what_the_caller_set():
    """Never the client machine's pipeline, blacklist, location or formats: the hub decides."""
    book = SessionBook("d", site_id="kitchen")
    SessionManager.sessions.pop("sb-w", None)
    wire = book.wire(book.for_turn("sb-w", lang="de-DE"))
    assert set(wire) == {"session_id", "active_skills", "utterance_states", "context",
                         "site_id", "lang"}
    assert wire["lang"] == "de-DE" and wire["site_id"] == "kitchen"
    SessionManager.sessions.pop("sb-w2", None)
    assert "lang" not in book.wire(book.for_turn("sb-w2"))


def test_after_a_reply_the_hubs_own_values_go_back_but_never_its_policy_fields():
    book = SessionBook("d")
    SessionManager.sessions.pop("sb-h", None)
    book.for_turn("sb-h", units="imperial")
    from_hub = Session("sb-h", lang="pt-PT", pipeline=["adapt_high"],
                       blacklisted_skills=["x.skill"], system_unit="metric")
    from_hub.activate_skill("parrot.skill")
    assert book.absorb("sb-h", from_hub.serialize())
    wire = book.wire(book.for_turn("sb-h"))
    assert wire["lang"] == "pt-PT" and wire["active_skills"][0][0] == "parrot.skill"
    assert wire["system_unit"] == "imperial"                  # the caller's setting wins
    for field in ("pipeline", "blacklisted_skills", "blacklisted_intents", "is_speaking"):
        assert field not in wire


def test_response_mode_only_takes_which_skills_listen_and_nothing_older():
    book = SessionBook("d")
    SessionManager.sessions.pop("sb-r", None)
    current = book.for_turn("sb-r")
    current.activate_skill("newer.skill")
    old = Session("sb-r", utterance_states={"alarm.skill": "response"})
    assert book.absorb("sb-r", old.serialize(), response_mode_only=True)
    now = SessionManager.sessions["sb-r"]
    assert now.active_skills[0][0] == "newer.skill"
    assert now.utterance_states["alarm.skill"] == "response"


def test_store_continues_a_conversation_in_a_new_process_and_is_private_per_client(tmp_path):
    from hivemind_chat_agent.client.session_store import SessionStore
    store = SessionStore(str(tmp_path), "127.0.0.1", 5678, "key-a")
    book = SessionBook("d", store=store)
    SessionManager.sessions.pop("sb-s", None)
    book.for_turn("sb-s")
    from_hub = Session("sb-s")
    from_hub.activate_skill("parrot.skill")
    book.absorb("sb-s", from_hub.serialize())
    book.save("sb-s")
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    assert "key-a" not in files[0].read_text() and "sb-s" not in files[0].name
    SessionManager.sessions.pop("sb-s")              # a new process
    again = SessionBook("d", store=SessionStore(str(tmp_path), "127.0.0.1", 5678, "key-a"))
    assert again.for_turn("sb-s").active_skills[0][0] == "parrot.skill"
    assert "active_skills" in again.wire(SessionManager.sessions["sb-s"])
    SessionManager.sessions.pop("sb-s")
    other = SessionBook("d", store=SessionStore(str(tmp_path), "127.0.0.1", 5678, "key-b"))
    assert other.for_turn("sb-s").active_skills == []  # another access key: its own store


def stored_file(directory, session_id):
    """The file a SessionStore under `directory` keeps `session_id` in, found by what it
    holds (each file names its session), not by how the store names it."""
    for path in directory.rglob("*.json"):
        if json.loads(path.read_text()).get("session_id") == session_id:
            return str(path)
    return None


def test_store_is_bounded_in_count_and_age(tmp_path):
    import os
    import time

    from hivemind_chat_agent.client.session_store import SessionStore
    store = SessionStore(str(tmp_path), "h", 1, "k", max_sessions=5, ttl=3600)
    for i in range(12):
        store.save(f"s{i}", {"session_id": f"s{i}"})
        path = stored_file(tmp_path, f"s{i}")
        os.utime(path, (time.time() - 100 + i, time.time() - 100 + i))
    store.prune()
    assert len(list(tmp_path.rglob("*.json"))) == 5
    assert store.load("s11") == {"session_id": "s11"} and store.load("s0") is None
    old = stored_file(tmp_path, "s11")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert store.load("s11") is None and not os.path.exists(old)


def test_config_accepts_host_forms_and_defaults():
    c = ClientConfig.from_dict(BASE)
    assert (c.host, c.port, c.secure, c.timeout, c.connect_timeout) == \
        ("127.0.0.1", 5678, False, 30.0, 10.0)
    assert ClientConfig.from_dict({**BASE, "host": "ws://127.0.0.1"}).url_host == \
        "ws://127.0.0.1"
    w = ClientConfig.from_dict({**BASE, "host": "wss://127.0.0.1/", "port": "6000"})
    assert (w.host, w.secure, w.port, w.url_host) == ("127.0.0.1", True, 6000, "wss://127.0.0.1")
    p = ClientConfig.from_dict({**BASE, "host": "ws://127.0.0.1:5999"})
    assert (p.host, p.port) == ("127.0.0.1", 5999)


def test_config_never_shows_secrets_in_repr():
    c = ClientConfig.from_dict(BASE)
    assert "k" * 32 not in repr(c) and "p" * 32 not in repr(c)


class _Identity:
    default_master = "ws://127.0.0.1"
    default_port = 7000
    access_key = "identity-key"
    password = "identity-password"
    site_id = "attic"


def test_identity_fills_what_config_lacks():
    c = ClientConfig.from_dict({}, identity=_Identity())
    assert (c.host, c.port, c.key, c.password, c.site_id) == \
        ("127.0.0.1", 7000, "identity-key", "identity-password", "attic")
    c = ClientConfig.from_dict({"port": 5000}, identity=_Identity())
    assert c.port == 5000


def test_missing_credentials_say_what_to_do():
    class Empty:
        default_master = default_port = access_key = password = site_id = None
    with pytest.raises(ConfigurationError, match="set-identity"):
        ClientConfig.from_dict({}, identity=Empty())


@pytest.mark.parametrize("bad", [{"timeout": 0}, {"timeout": "soon"}, {"max_connections": 0},
                                 {"host": "ws://"}, {"host": "ws://hub:port"},
                                 {"host": "ws://hub/path"}, {"default_session_id": "default"}])
def test_bad_values_are_configuration_errors(bad):
    with pytest.raises(ConfigurationError):
        ClientConfig.from_dict({**BASE, **bad})


def test_sessions_in_memory_are_bounded_and_go_to_the_store(tmp_path):
    """ovos-bus-client's SessionManager keeps every Session forever; the book forgets the
    least recently used past max_sessions and the idle ones, keeping those in use, and a
    forgotten conversation continues from the store."""
    from hivemind_chat_agent.client.session_store import SessionStore
    now = [0.0]
    store = SessionStore(str(tmp_path), "h", 1, "k")
    book = SessionBook("d", store=store, max_sessions=5, idle_ttl=100, clock=lambda: now[0])
    for i in range(20):
        sid = f"bound-{i}"
        SessionManager.sessions.pop(sid, None)
        book.for_turn(sid)
        from_hub = Session(sid)
        from_hub.activate_skill(f"skill-{i}")
        book.absorb(sid, from_hub.serialize())
        book.save(sid)
        now[0] += 1
        book.trim(keep={"bound-0"})
    assert len(book) == 5                              # the one kept in use among them
    assert "bound-0" in SessionManager.sessions and "bound-3" not in SessionManager.sessions
    again = book.for_turn("bound-3")                   # comes back from the store
    assert again.active_skills[0][0] == "skill-3"
    now[0] += 1000                                     # everything idle
    book.trim()
    assert len(book) == 0
    assert not [s for s in SessionManager.sessions if s.startswith("bound-")]


def test_the_hubs_session_goes_back_as_the_hub_sent_it():
    """A 4.0 hub's ovos-core (ovos-bus-client 1.x) keys intent context by its name; this
    process's ovos-bus-client 2.x would re-key it by value if it re-serialized the Session,
    and the hub's skill would no longer find its context."""
    book = SessionBook("d")
    SessionManager.sessions.pop("sb-raw", None)
    book.for_turn("sb-raw", lang="en-US")
    frame = [{"entities": [{"key": "Memory", "data": [["ada", "Memory"]], "confidence": 1.0}],
              "metadata": {}}, 1796041461.0]
    from_hub = {"session_id": "sb-raw", "lang": "pt-PT", "pipeline": ["adapt_high"],
                "context": {"timeout": 120, "frame_stack": [frame]},
                "active_skills": [["memory.test", 1796041461.0]]}
    assert book.absorb("sb-raw", from_hub)
    wire = book.wire(book.for_turn("sb-raw"))
    assert wire["context"] == from_hub["context"]
    assert wire["active_skills"] == from_hub["active_skills"]
    assert wire["lang"] == "en-US" and "pipeline" not in wire   # the caller's, not the hub's
