"""core/front_guard: who may use an HTTP front, decided from headers alone (no I/O, a fake
clock). The same checks run through the real servers in tests/test_front_security.py."""
from hivemind_chat_agent.core.front_guard import (
    FailureThrottle,
    FrontGuard,
    InFlight,
    Keys,
    host_name,
)
from hivemind_chat_agent.core.peer_gate import Caps, PeerGate

JSON = {"host": "127.0.0.1:8080", "content-type": "application/json"}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def status(guard, headers, peer="127.0.0.1", body=True):
    caller, refusal = guard.admit(headers, peer, body)
    return refusal.status if refusal else caller


def test_host_must_be_loopback_the_bind_address_or_allowed():
    guard = FrontGuard("192.168.1.5", Keys(["k"]), allowed_hosts=["hub.lan"])
    auth = {"authorization": "Bearer k", "content-type": "application/json"}
    for host in ("127.0.0.1:8080", "localhost", "[::1]:8080", "127.0.0.2", "192.168.1.5:80",
                 "HUB.lan:8080"):
        assert status(guard, {**auth, "host": host}) not in (421,), host
    for host in ("evil.example", "evil.example:8080", "", "192.168.1.6", "hub.lan.evil.example"):
        assert status(guard, {**auth, "host": host}) == 421, host
    # a wildcard bind address is not a name anyone may use
    assert status(FrontGuard("0.0.0.0", Keys(["k"])), {**auth, "host": "0.0.0.0"}) == 421
    assert host_name("[::1]:80") == "::1" and host_name("Example.ORG:1") == "example.org"


def test_a_browser_origin_must_be_loopback_or_allowed():
    guard = FrontGuard("127.0.0.1", allowed_origins=["https://chat.example.org"])
    assert status(guard, JSON) == ""                                  # no Origin: not a page
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "https://chat.example.org",
                   "https://chat.example.org:443/"):
        assert status(guard, {**JSON, "origin": origin}) == "", origin
    for origin in ("https://attacker.example", "null", "http://chat.example.org",
                   "https://chat.example.org:8443", "file://", "garbage"):
        assert status(guard, {**JSON, "origin": origin}) == 403, origin


def test_a_body_must_be_declared_json():
    guard = FrontGuard("127.0.0.1")
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
        assert status(guard, {"host": "localhost", "content-type": kind}) == 415, kind
    assert status(guard, {"host": "localhost", "content-type": "application/json; charset=utf-8"}
                  ) == ""
    assert status(guard, {"host": "localhost"}, body=False) == ""    # a GET needs none


def test_each_key_is_its_own_caller_and_a_wrong_one_is_401():
    keys = Keys(["alpha", "beta", "alpha"])
    assert len(keys) == 2
    a, b = keys.caller("Bearer alpha"), keys.caller("bearer beta ")
    assert a and b and a != b and "alpha" not in a
    assert keys.caller("Bearer gamma") is None and keys.caller("alpha") is None
    assert Keys().caller("anything") == ""
    guard = FrontGuard("127.0.0.1", keys)
    assert status(guard, {**JSON, "authorization": "Bearer beta"}) == b
    assert status(guard, {**JSON, "authorization": "Bearer nope"}) == 401


def test_a_public_page_needs_no_key_but_still_the_host_and_origin_checks():
    """An A2A agent card: readable without a key (it says the rest needs one)."""
    guard = FrontGuard("127.0.0.1", Keys(["k"]))
    page = {"host": "127.0.0.1:9999"}
    assert guard.admit(page, "127.0.0.1", False)[1].status == 401
    assert guard.admit(page, "127.0.0.1", False, public=True) == ("", None)
    assert guard.admit({"host": "evil.example"}, "127.0.0.1", False,
                       public=True)[1].status == 421
    assert guard.admit({**page, "origin": "https://attacker.example"}, "127.0.0.1", False,
                       public=True)[1].status == 403


def test_wrong_keys_from_one_peer_are_slowed_down_others_are_not():
    clock = Clock()
    guard = FrontGuard("127.0.0.1", Keys(["k"]),
                       throttle=FailureThrottle(burst=3, every=2.0, clock=clock))
    wrong = {**JSON, "authorization": "Bearer x"}
    right = {**JSON, "authorization": "Bearer k"}
    assert [status(guard, wrong, "10.0.0.9") for _ in range(4)] == [401, 401, 401, 429]
    caller, refusal = guard.admit(right, "10.0.0.9", True)
    assert refusal.status == 429 and refusal.retry_after == 2        # even the right key waits
    assert status(guard, right, "10.0.0.8") != 429                    # another peer does not
    clock.now += 2.0
    assert status(guard, wrong, "10.0.0.9") == 401                    # one try per 2 s
    assert status(guard, wrong, "10.0.0.9") == 429
    clock.now += 60
    assert status(guard, right, "10.0.0.9") not in (401, 429)


def test_requests_in_flight_and_connections_are_capped():
    flight = InFlight(2)
    assert flight.begin("a") and flight.begin("a") and not flight.begin("a")
    assert flight.begin("b")
    flight.end("a")
    assert flight.begin("a") and len(flight) == 3
    guard = FrontGuard("127.0.0.1", turns_per_caller=1)
    assert guard.begin_turn("c") is None and guard.begin_turn("c").status == 429
    guard.end_turn("c")
    assert guard.begin_turn("c") is None
    peers = PeerGate(allow=None, caps=Caps(connections=3, connections_per_peer=2))  # HTTP's
    admitted = lambda peer: peers.admit(peer) is None                # noqa: E731
    assert admitted("x") and admitted("x") and not admitted("x")
    assert admitted("y") and not admitted("z")                       # the total
    peers.release("x")
    peers.release("nobody")                                          # harmless
    assert admitted("z") and peers.open == 3


def test_errors_to_clients_name_the_hub_and_the_failure_never_paths_headers_or_secrets():
    from hivemind_chat_agent.bridges.hub_failures import hub_failure as hub_error
    from hivemind_chat_agent.errors import (
        ConnectionLostError,
        HubKeyChangedError,
        HubUnreachableError,
        TurnTimeoutError,
    )
    leaky = [HubKeyChangedError("the hub's key is not the one pinned in "
                                "/root/.config/hivemind/hivemind-chat-agent/hubs.json"),
             HubUnreachableError("the hub answered HTTP 502: Server: nginx/1.2\r\n"
                                 "Set-Cookie: session=abc; key=hunter2"),
             ConnectionLostError("lost /var/lib/secret"), TurnTimeoutError("at /home/x")]
    for e in leaky:
        error = hub_error(e, "hub.lan:5678")
        assert "hub.lan:5678" in error.message
        for secret in ("/root", "nginx", "Set-Cookie", "hunter2", "/var/lib", "/home"):
            assert secret not in error.message, (type(e).__name__, error.message)
    assert hub_error(leaky[0], "h:1").status == 502 and "credentials" in hub_error(
        leaky[0], "h:1").message
