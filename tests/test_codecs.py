"""JSON-B91/Z85B/Z85P frames: z85base91's C codecs leak every result buffer; ours must not,
and must stay byte-compatible with peers that still use them."""
import os

import pytest

from hivemind_bus_client import encryption
from hivemind_bus_client.encryption import (SupportedCiphers, SupportedEncodings,
                                            decrypt_from_json, encrypt_as_json)

from hivemind_chat_agent import compat

compat.use_leak_free_codecs()   # what a connection or the hub plugin does when it starts

LEAKY = [SupportedEncodings.JSON_B91, SupportedEncodings.JSON_Z85B, SupportedEncodings.JSON_Z85P]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def c_codecs():
    """z85base91's C-backed classes, as a peer without our fix uses them."""
    import importlib
    import z85base91
    fresh = importlib.reload(z85base91)   # its module body builds the C classes anew
    codecs = {"B91": fresh.B91, "Z85B": fresh.Z85B, "Z85P": fresh.Z85P}
    from hivemind_chat_agent import compat
    compat.use_leak_free_codecs()         # the reload put the C classes back in z85base91
    return codecs


@pytest.mark.parametrize("name", ["B91", "Z85B", "Z85P"])
def test_our_codecs_read_and_write_what_the_c_codecs_do(name):
    ours, theirs = getattr(encryption, name), c_codecs()[name]
    assert "ctypes" not in repr(vars(ours)) and ours is not theirs
    for size in (0, 1, 3, 4, 5, 31, 257, 4099):
        data = os.urandom(size)
        assert ours.encode(data) == theirs.encode(data)
        assert ours.decode(theirs.encode(data)) == data
        assert theirs.decode(ours.encode(data)) == data


@pytest.mark.parametrize("encoding", LEAKY)
def test_frames_in_the_leaky_encodings_cost_no_memory(encoding):
    """With the C codecs, 300 round trips of a 16 KB frame kept about 10 MB."""
    key = os.urandom(16)
    text = os.urandom(8192).hex()
    for _ in range(20):    # warm up allocator pools
        decrypt_from_json(key, encrypt_as_json(key, text, cipher=SupportedCiphers.AES_GCM,
                                               encoding=encoding),
                          cipher=SupportedCiphers.AES_GCM, encoding=encoding)
    before = rss_mb()
    for _ in range(300):
        frame = encrypt_as_json(key, text, cipher=SupportedCiphers.AES_GCM, encoding=encoding)
        assert decrypt_from_json(key, frame, cipher=SupportedCiphers.AES_GCM,
                                 encoding=encoding) == text
    assert rss_mb() - before < 3, f"{rss_mb() - before:.1f} MB kept by 300 frames"
