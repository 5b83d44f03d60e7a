"""Every change this package makes to another library's objects, and every private attribute it
relies on, in one place. Nothing here runs at import: `for_client()` runs when a connection
opens, `for_hub()` when the hub plugin starts; both are idempotent. tests/test_compat.py fails
when an attribute a patch needs disappears from the pinned versions (constraints.txt).

Each entry: the library and versions it targets, why, and the upstream fix that retires it.

- `use_leak_free_codecs`: hivemind-bus-client 1.x `encryption.B91/Z85B/Z85P` and z85base91
  0.0.5. Its C codecs never free their result buffers: every JSON-B91/Z85 frame leaked its size
  (docs/performance.md#why-the-code-is-as-it-is). Fix: free the buffers in z85base91.
- `watch_v4_decoding`: hivemind-core 4.x `HiveMindClientConnection.decode`. 4.0 decodes
  plain-text frames from anyone who knows the access key; the hub plugin must know whether the
  frame it handles was ciphertext. Fix: reject plain text once a connection has a key (the TODO
  in `decode`) and verify the password envelope.
- `bound_frame_length`: websocket-client 1.x `frame_buffer.recv_length` (of one socket). A
  frame is refused by its header, before websocket-client buffers the length the hub announces
  (docs/performance.md#why-the-code-is-as-it-is). Fix: a maximum frame size in websocket-client.
- `register_session`: ovos-bus-client 1.x `SessionManager.__lock`, 2.x `SessionManager._lock`.
  2.x keeps only the default Session in the registry; agents, personas and skills of this
  process still look conversations up there by id (2.x's intended model: nothing to fix).
- `name_loggers_cheaply`: ovos-utils before 0.15 (0.8.5 on the 4.0 stable line)
  `LOG._get_real_logger`. It named each call's logger from `inspect.stack()`, which builds a
  record of every frame on the stack and reads each one's source line from disk, on every LOG
  call, DEBUG lines below the level included: under one satellite's flood that was 60-64% of
  a 4.0 hub's IO loop (a profile of benchmarks/bench_ovos_flood.py). Replaced by the caller-
  frame lookup 0.15 has: the same logger names. Fix: upgrade to ovos-utils 0.15.
- `pace_websocket_reads`: hivemind-websocket-protocol (0.0.x on 4.0, 1.0.x on 5.x)
  `HiveMindTornadoWebSocket.on_message`. Every frame's handling (CPU time on the loop's
  thread) is charged to its
  connection's share of the IO loop (core/loop_share.py); a connection over its share has its
  next frame read later (tornado waits for `on_message`'s awaitable), so one satellite's flood
  cannot hold up the others' frames; a connection refused `busy` has its next frame read a
  little later too (`hold_reads`). Fix: a per-connection read budget in hivemind-core.
- `paho_writes_on_loop_thread`: paho-mqtt 2.x `Client._thread`. A publish from a thread other
  than the one running `loop()` writes to the socket at once, while the loop thread may be
  reading it: over mqtts:// two threads then share one OpenSSL object (a lost connection in a
  test). Naming the loop's thread as paho's own makes a publish queue its packet and wake the
  loop, which writes it. Fix: a paho option to write from the loop only.
- `mqtt_writes_on_its_thread` (hub side): hivemind-mqtt-protocol 0.2.x runs paho's
  `loop_forever` on its own thread (so paho's `_thread` is None), and its connections'
  `send_msg` closes over that client. The hub plugin writes replies from its own loop's thread
  (the MQTT thread runs no asyncio loop), and paho then writes from both threads at once:
  `_packet_write` pops and sends without a lock, so two frames could leave in the wrong order,
  and the client's Noise transport refuses a frame out of order ("a frame from the hub failed
  authentication", once under load with 24 sessions on one connection). The MQTT thread is
  named paho's own, as above, at the connection's first message on it. A queued packet waits
  for the loop's next turn: `loop_start` and `loop()` make the socket pair a publish writes to
  to wake the loop's select(), `loop_forever` does not (and every reconnect closes it), so
  without one each reply waited out select's 1 s timeout (a steady turn over MQTT took 997 ms,
  benchmarks/bench_mqtt.py). So the pair is made too, on the loop's thread, each time. Fix: the
  same paho option, or the plugin's publish handed to the MQTT thread.
- `debounce_last_seen`: hivemind-core 4.x `HiveMindListenerProtocol.update_last_seen`. 4.0
  writes a client's `last_seen` after every message it sends, on the IO loop, and its JSON
  database rewrites the whole client file each time: under one satellite's flood 9 % of a core
  (28 % of the IO loop's busy time, a profile of benchmarks/bench_ovos_flood.py), every other
  satellite's frames waiting behind it. Now at most one write per client per
  `last_seen_update_interval` seconds (server.json; 60 by default, 0 for every message): 5.x's
  own setting and default. Fix: upgrade to hivemind-core 5.x, which debounces it itself.
- `socket_handler` (reads, patches nothing): hivemind-websocket-protocol 0.0.x `send_msg`'s
  closure. 4.0's `send_msg` drops the write's Future and asyncio logs each failed one. Fix:
  return the Future from `send_msg`.
"""
import asyncio
import importlib
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

# codec name -> module of z85base91's pure-Python version (its own fallback for a missing C
# library: the same bytes, and for HiveMind's frame sizes about the same time)
PURE_CODECS = {"B91": "z85base91.b91", "Z85B": "z85base91.z85b", "Z85P": "z85base91.z85p"}
CODEC_USERS = ("z85base91", "hivemind_bus_client.encryption")
_WATCHED = "_hivemind_chat_watch"
_CHEAP_NAMES = "_hivemind_chat_cheap_names"
_PACED = "_hivemind_chat_paced"
_ALLOWANCE = "_hivemind_chat_loop_allowance"     # on hivemind-core's connection object
_DEBOUNCED = "_hivemind_chat_debounced"
LAST_SEEN_INTERVAL = 60.0    # hivemind-core 5.x's default for `last_seen_update_interval`


def for_client() -> None:
    """What a client connection needs before its first frame."""
    use_leak_free_codecs()


def for_hub(pacing: Optional[Tuple[float, float]] = None) -> None:
    """What the hub plugin needs before its first satellite; `pacing`: (share, burst) of the
    IO loop per connection (core/loop_share.loop_pacing), None for none."""
    use_leak_free_codecs()
    name_loggers_cheaply()
    debounce_last_seen()
    if pacing is not None:
        pace_websocket_reads(*pacing)


def name_loggers_cheaply() -> bool:
    """Give ovos-utils' LOG (before 0.15, which does it itself: it has `is_enabled_for`) a
    `_get_real_logger` that reads only the caller's frame. True when it patched now or before."""
    try:
        from ovos_utils.log import LOG
    except ImportError:
        return False
    if getattr(LOG, _CHEAP_NAMES, False):
        return True
    if hasattr(LOG, "is_enabled_for") or not hasattr(LOG, "_get_real_logger"):
        return False

    def _get_real_logger(cls):
        # frames: [0] this, [1] LOG.debug/info/..., [2] the caller: as ovos-utils 0.8.5 counts
        caller = sys._getframe(2)
        name = "" if cls.name is None else cls.name + " - "
        name += (f"{caller.f_globals.get('__name__', '')}:{caller.f_code.co_name}:"
                 f"{caller.f_lineno}")
        logger = cls.create_logger(name, tostdout=True)
        if cls.diagnostic_mode:
            try:
                from ovos_bus_client.message import dig_for_message
                msg = dig_for_message()
                if msg:
                    logger.debug(f"DIAGNOSTIC - source bus message {msg.serialize()}")
            except ImportError:
                pass
        return logger
    LOG._get_real_logger = classmethod(_get_real_logger)
    setattr(LOG, _CHEAP_NAMES, True)
    return True


def debounce_last_seen() -> bool:
    """Give hivemind-core 4.x's `update_last_seen` 5.x's debounce: a client's `last_seen` is
    written when it was not in the last `last_seen_update_interval` seconds (read from
    server.json as 5.x reads it). True when it patched now or before; False where there is
    nothing to patch (no hivemind-core; 5.x, which has the setting; an interval of 0)."""
    try:
        from hivemind_core.protocol import HiveMindListenerProtocol
    except ImportError:
        return False
    original = HiveMindListenerProtocol.update_last_seen
    if getattr(original, _DEBOUNCED, False):
        return True
    if hasattr(HiveMindListenerProtocol, "last_seen_update_interval"):
        return False
    interval = _last_seen_interval()
    if interval <= 0:
        return False
    written: Dict[str, float] = {}     # access key -> when its last_seen was last written

    def update_last_seen(self, client):
        # on the IO loop, as every message of hivemind-core's is handled: one writer
        now = time.monotonic()
        last = written.get(client.key)
        if last is not None and now - last < interval:
            return
        original(self, client)
        written[client.key] = now
    setattr(update_last_seen, _DEBOUNCED, True)
    HiveMindListenerProtocol.update_last_seen = update_last_seen
    return True


def _last_seen_interval() -> float:
    """server.json's `last_seen_update_interval` (hivemind-core 5.x's name), else 60 s."""
    try:
        from hivemind_core.config import get_server_config
        value = float(get_server_config().get("last_seen_update_interval",
                                              LAST_SEEN_INTERVAL))
    except (ImportError, TypeError, ValueError, OSError):
        return LAST_SEEN_INTERVAL
    return value if value >= 0 else LAST_SEEN_INTERVAL


def use_leak_free_codecs() -> None:
    """Point hivemind-bus-client's encryption (and z85base91's own names) at the pure-Python
    codecs. Does nothing where a package is missing."""
    try:
        pure = {name: getattr(importlib.import_module(module), name)
                for name, module in PURE_CODECS.items()}
    except (ImportError, AttributeError):
        return
    for user in CODEC_USERS:
        try:
            module = importlib.import_module(user)
        except ImportError:
            continue
        for name, codec in pure.items():
            if hasattr(module, name) and getattr(module, name) is not codec:
                setattr(module, name, codec)


def watch_v4_decoding(mark: Callable[[Any, Any], None]) -> bool:
    """Wrap hivemind-core 4.x's `HiveMindClientConnection.decode` so that `mark(connection,
    payload)` runs after each frame decoded (raising frames mark nothing), on the IO loop that
    then hands the message to the agent protocol. False where there is nothing to wrap (no
    hivemind-core, or 5.x, whose connections have no password-handshake key)."""
    try:
        from hivemind_core.protocol import HiveMindClientConnection
    except ImportError:
        return False
    if not hasattr(HiveMindClientConnection, "crypto_key"):
        return False
    original = HiveMindClientConnection.decode
    if getattr(original, _WATCHED, False):
        return True

    def decode(self, payload, *args, **kwargs):
        mark(self, None)                                     # unproven until decoded
        message = original(self, payload, *args, **kwargs)   # raises on a failed decryption
        mark(self, payload)
        return message
    setattr(decode, _WATCHED, True)
    HiveMindClientConnection.decode = decode
    return True


def mqtt_writes_on_its_thread(connection: Any) -> bool:
    """If `connection` (hivemind-core's) is hivemind-mqtt-protocol's, its `send_msg` closing
    over a paho client whose loop runs on the calling thread (called from that thread, at the
    connection's first message), make paho leave every write to this thread. True if it did
    now or before."""
    send = getattr(connection, "send_msg", None)
    for cell in getattr(send, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:          # an empty cell
            continue
        if hasattr(value, "_out_packet") and hasattr(value, "_thread") and \
                hasattr(value, "publish"):
            if value._thread is None:
                paho_writes_on_loop_thread(value, threading.current_thread())
            if value._thread is not threading.current_thread():
                return False
            return _paho_loop_wakes_on_publish(value)
    return False


def _paho_loop_wakes_on_publish(client: Any) -> bool:
    """Give paho's `client`, whose loop runs on the calling thread, the socket pair a publish
    from another thread writes to so that the loop's select() returns (what `loop()` makes
    and `loop_forever` does not); False if this paho has no such pair."""
    if not hasattr(client, "_sockpairR") or not hasattr(client, "_sockpairW"):
        return False
    if client._sockpairR is None or client._sockpairW is None:
        make_pair = getattr(sys.modules.get(type(client).__module__), "_socketpair_compat", None)
        if make_pair is None:
            return False
        client._sockpairR, client._sockpairW = make_pair()
    return True


def paho_writes_on_loop_thread(client: Any, thread: Any) -> bool:
    """Make paho-mqtt's `client` leave every write to `thread`, the one that runs its
    `loop()`; False if this paho has no such attribute."""
    if not hasattr(client, "_thread"):
        return False
    client._thread = thread
    return True


def bound_frame_length(sock: Any, limit: int, too_large: Callable[[int], Exception]) -> bool:
    """Make websocket-client's socket `sock` raise `too_large(size)` as soon as a frame header
    (plus any continuation data already buffered) announces more than `limit` bytes. False if
    this websocket-client has no such buffer."""
    buffer, cont = getattr(sock, "frame_buffer", None), getattr(sock, "cont_frame", None)
    if buffer is None or cont is None or not hasattr(buffer, "recv_length"):
        return False
    read_length = buffer.recv_length

    def bounded_length():
        read_length()
        pending = len(cont.cont_data[1]) if cont.cont_data else 0
        if (buffer.length or 0) + pending > limit:
            raise too_large(buffer.length + pending)
    buffer.recv_length = bounded_length
    return True


def _registry_lock():
    from ovos_bus_client.session import SessionManager
    return getattr(SessionManager, "_lock", None) or SessionManager._SessionManager__lock


def register_session(sess: Any) -> Any:
    """Keep `sess` in `SessionManager.sessions` under its id, as ovos-bus-client 1.x's
    `SessionManager.update` did (2.x keeps only the default session there)."""
    from ovos_bus_client.session import SessionManager
    with _registry_lock():
        SessionManager.sessions[sess.session_id] = sess
    return sess


def socket_handler(send_msg: Any) -> Optional[Any]:
    """The tornado handler a hivemind-websocket-protocol `send_msg` closes over (it has
    `write_message`), or None."""
    for cell in getattr(send_msg, "__closure__", None) or ():
        try:
            candidate = cell.cell_contents
        except ValueError:     # an empty cell
            continue
        if callable(getattr(candidate, "write_message", None)):
            return candidate
    return None


def pace_websocket_reads(share: float, burst: float) -> bool:
    """Wrap hivemind-websocket-protocol's `HiveMindTornadoWebSocket.on_message` with `paced`
    (once per process; the first plugin's `share`/`burst` hold). False where that transport
    is not installed."""
    try:
        from hivemind_websocket_protocol import HiveMindTornadoWebSocket as Handler
    except ImportError:
        return False
    if not getattr(Handler.on_message, _PACED, False):
        Handler.on_message = paced(Handler.on_message, share, burst)
    return True


def charge_loop_time(connection: Any, seconds: float) -> None:
    """Charge IO-loop CPU time spent for `connection` outside `on_message` (writing its
    replies; measured with time.thread_time as `paced` does) to its allowance, if `paced`
    gave it one."""
    allowance = getattr(connection, _ALLOWANCE, None)
    if allowance is not None:
        allowance.charge(seconds)


def hold_reads(connection: Any, seconds: float) -> bool:
    """IO loop, while `connection`'s frame is handled: read its next frame `seconds` later at
    the earliest (core/loop_share.LoopAllowance.hold). False where its reads are not paced
    (another transport, or pacing off): nothing is put off."""
    allowance = getattr(connection, _ALLOWANCE, None)
    if allowance is None:
        return False
    allowance.hold(seconds)
    return True


def paced(on_message: Callable[[Any, Any], Any], share: float, burst: float,
          clock: Callable[[], float] = time.monotonic,
          cpu: Callable[[], float] = time.thread_time) -> Callable[[Any, Any], Any]:
    """`on_message` (a tornado handler's) timed, each frame's CPU time on the loop's thread
    (`cpu`: not wall time, which a busy machine inflates for every connection alike) charged
    to its connection's LoopAllowance (on hivemind-core's connection object,
    `handler.client`, refilled by `clock`); when the connection is over its share, the
    awaitable returned makes tornado read its next frame only after the pause."""
    from hivemind_chat_agent.core.loop_share import LoopAllowance

    def wrapped(handler, message):
        owner = getattr(handler, "client", None) or handler
        allowance = getattr(owner, _ALLOWANCE, None)
        if allowance is None:       # made first: the plugin may `hold_reads` at this frame
            allowance = LoopAllowance(share, burst, clock)
            try:
                setattr(owner, _ALLOWANCE, allowance)
            except AttributeError:
                allowance = None
        started = cpu()
        result = on_message(handler, message)
        if result is not None or allowance is None:   # a handler that awaits by itself
            return result
        allowance.charge(cpu() - started)
        pause = allowance.pause()
        return asyncio.sleep(pause) if pause > 0 else None
    setattr(wrapped, _PACED, True)
    return wrapped
