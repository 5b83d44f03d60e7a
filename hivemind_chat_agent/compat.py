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
- `paho_writes_on_loop_thread`: paho-mqtt 2.x `Client._thread`. A publish from a thread other
  than the one running `loop()` writes to the socket at once, while the loop thread may be
  reading it: over mqtts:// two threads then share one OpenSSL object (a lost connection in a
  test). Naming the loop's thread as paho's own makes a publish queue its packet and wake the
  loop, which writes it. Fix: a paho option to write from the loop only.
- `socket_handler` (reads, patches nothing): hivemind-websocket-protocol 0.0.x `send_msg`'s
  closure. 4.0's `send_msg` drops the write's Future and asyncio logs each failed one. Fix:
  return the Future from `send_msg`.
"""
import importlib
from typing import Any, Callable, Optional

# codec name -> module of z85base91's pure-Python version (its own fallback for a missing C
# library: the same bytes, and for HiveMind's frame sizes about the same time)
PURE_CODECS = {"B91": "z85base91.b91", "Z85B": "z85base91.z85b", "Z85P": "z85base91.z85p"}
CODEC_USERS = ("z85base91", "hivemind_bus_client.encryption")
_WATCHED = "_hivemind_chat_watch"


def for_client() -> None:
    """What a client connection needs before its first frame."""
    use_leak_free_codecs()


def for_hub() -> None:
    """What the hub plugin needs before its first satellite."""
    use_leak_free_codecs()


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
