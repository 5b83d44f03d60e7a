"""Session bookkeeping and configuration, without sockets."""
import pytest
from ovos_bus_client.session import Session, SessionManager

from hivemind_chat_agent.config import ClientConfig, default_session_id_for
from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.sessions import SessionBook

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
    assert SessionBook.absorb("sb-2", changed.serialize())
    assert SessionManager.sessions["sb-2"].active_skills[0][0] == "weather.skill"
    assert not SessionBook.absorb("sb-3", changed.serialize())   # id mismatch
    assert "sb-3" not in SessionManager.sessions
    assert not SessionBook.absorb("sb-2", {"session_id": "sb-2", "active_skills": "garbage"})


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
