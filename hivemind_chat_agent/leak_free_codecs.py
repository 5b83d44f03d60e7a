"""Keep HiveMind's JSON-B91/Z85B/Z85P frames from leaking memory.

z85base91 0.0.5 encodes and decodes through a C library whose result buffers are never freed,
so every frame in those encodings leaks its own size in whichever process encodes or decodes
it. hivemind-bus-client offers JSON-B91 first and hivemind-core picks the client's first
allowed encoding, so a stock satellite's every frame leaked on a 4.0 hub: about 14 MB per 1000
turns (heaptrack: 10 MB over 9000 `encode` calls in `libbase91`, none freed).

The same package ships pure-Python versions of the three codecs (its own fallback when the C
library is missing). They give the same bytes and, for HiveMind's frame sizes, cost about the
same time, because the C wrappers copy their input byte by byte in Python. `install()` makes
hivemind-bus-client use them, once per process, in the hub (from the plugin) and in the client.
Upstream fix: free the buffers in z85base91 (or return Python bytes from C).
"""
import importlib

# codec name -> module of z85base91's pure-Python version
_PURE = {"B91": "z85base91.b91", "Z85B": "z85base91.z85b", "Z85P": "z85base91.z85p"}
# modules that hold the codecs by name
_USERS = ("z85base91", "hivemind_bus_client.encryption")


def install() -> None:
    """Point hivemind-bus-client's encryption (and z85base91's own names) at the pure-Python
    codecs. Idempotent; does nothing where a package is missing."""
    try:
        pure = {name: getattr(importlib.import_module(module), name)
                for name, module in _PURE.items()}
    except (ImportError, AttributeError):
        return
    for user in _USERS:
        try:
            module = importlib.import_module(user)
        except ImportError:
            continue
        for name, codec in pure.items():
            if hasattr(module, name) and getattr(module, name) is not codec:
                setattr(module, name, codec)
