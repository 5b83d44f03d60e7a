"""core/peer_gate.py without I/O: who `hivemind-chat wyoming` admits (Wyoming has no
authentication), how many connections and turns one peer and everyone may hold, and which of a
flood of alike log lines get written (on a fake clock)."""
import pytest
from fake_clock import FakeClock

from hivemind_chat_agent.core.peer_gate import (
    NOT_ALLOWED,
    OVER_PEER,
    OVER_TOTAL,
    AllowList,
    Caps,
    Notices,
    PeerGate,
    is_loopback_bind,
    parse_address,
)
from hivemind_chat_agent.errors import ConfigurationError


def test_beyond_loopback_an_allow_list_is_required_and_the_error_says_how():
    for host in ("0.0.0.0", "", "::", "192.168.1.5", "myhost.lan"):
        with pytest.raises(ConfigurationError) as refused:
            AllowList.for_bind(host, [], "the Wyoming server", "--allow-from 192.168.1.20")
        text = str(refused.value)
        assert "no authentication" in text and "--allow-from 192.168.1.20" in text
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback_bind(host)
        assert AllowList.for_bind(host, [], "x", "y").describe() == "loopback only"


def test_without_a_list_only_loopback_peers_with_one_only_its_networks():
    loopback_only = AllowList()
    assert loopback_only.allows("127.0.0.3") and loopback_only.allows("::1")
    assert not loopback_only.allows("192.168.1.20") and not loopback_only.allows("?")
    listed = AllowList.for_bind("0.0.0.0", ["192.168.1.20", "10.0.0.0/8", "fd00::/8",
                                            "127.0.0.2"], "x", "y")
    assert listed.allows("192.168.1.20") and not listed.allows("192.168.1.21")
    assert listed.allows("10.200.3.4") and listed.allows("fd12::5")
    assert listed.allows("::ffff:192.168.1.20")      # a dual-stack socket's IPv4 peer
    assert listed.allows("127.0.0.2") and not listed.allows("127.0.0.3")
    assert not listed.allows("127.0.0.1")            # a list names everyone admitted
    assert listed.allows("fd00::1%eth0")             # a scope id is not part of the address
    assert AllowList.for_bind("0.0.0.0", ["192.168.1.20/24"], "x", "y").allows("192.168.1.99")


def test_a_bad_allow_from_names_the_value_and_shows_good_ones():
    for bad in ("nonsense", "192.168.1.300", "10.0.0.0/40", "", "fd00::/200"):
        with pytest.raises(ConfigurationError) as refused:
            AllowList.for_bind("0.0.0.0", [bad], "x", "y")
        assert repr(bad) in str(refused.value) and "192.168.1.0/24" in str(refused.value)
    assert parse_address("::ffff:10.1.2.3").version == 4


def test_connection_caps_in_total_and_per_peer_and_release_gives_the_place_back():
    gate = PeerGate(AllowList(), Caps(connections=3, connections_per_peer=2, turns_per_peer=1))
    assert gate.admit("127.0.0.2") is None and gate.admit("127.0.0.2") is None
    assert gate.admit("127.0.0.2") == OVER_PEER
    assert gate.admit("127.0.0.3") is None
    assert gate.admit("127.0.0.4") == OVER_TOTAL
    assert gate.admit("192.168.1.20") == NOT_ALLOWED      # refused before any cap is asked
    assert gate.open == 3 and gate.refused == {OVER_PEER: 1, OVER_TOTAL: 1, NOT_ALLOWED: 1}
    gate.release("127.0.0.2")
    assert gate.admit("127.0.0.4") is None
    for peer in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        gate.release(peer)
    assert gate.open == 0 and not gate.open_by_peer      # nothing kept for peers gone


def test_turns_in_flight_are_capped_per_peer():
    gate = PeerGate(AllowList(), Caps(turns_per_peer=2))
    assert gate.try_begin_turn("a") and gate.try_begin_turn("a")
    assert not gate.try_begin_turn("a") and gate.try_begin_turn("b")
    gate.end_turn("a")
    assert gate.try_begin_turn("a")


def test_caps_below_one_are_refused():
    for bad in ({"connections": 0}, {"connections_per_peer": -1}, {"turns_per_peer": 0}):
        with pytest.raises(ConfigurationError):
            Caps(**bad)


def test_a_flood_of_alike_lines_is_one_line_then_one_summary_a_minute():
    clock = FakeClock()
    notices = Notices(clock.now, interval=60)
    lines = [notices.line("not allowed", f"refused {i}") for i in range(1000)]
    assert [line for line in lines if line] == ["refused 0"]
    assert notices.line("bad event", "bad") == "bad"           # another kind has its own
    clock.advance(61)
    assert notices.line("not allowed", "refused again") == \
        "refused again (999 more alike in the last 61 s)"
    assert notices.line("not allowed", "and again") is None
