"""The shell every server in front of the agent runs in: `hivemind-chat openai`, `mcp`,
`wyoming`, and the fronts to come (A2A, Home Assistant). A front keeps only what is its own
(its protocol, its routes, its options); where it listens, who may reach it, the agent behind
it and how it stops are decided here, once, the same way for all:

- **where**: `parse_uri(uri, option, schemes, example)` -> `Address`; a URI of another shape
  is a ConfigurationError naming the front's own option (`--uri`, `--http`), never a message
  rewritten afterwards.
- **who**: `is_loopback(host)`; `check_exposure(host, keys)`: anyone who reaches a front talks
  to the hub as this client, so a front with keys listens beyond loopback only with one
  (Wyoming has no keys: its allow list, core/peer_gate.AllowList.for_bind, says the same);
  `add_key_options` and `read_keys` give the keys (--api-key, --api-key-file,
  HIVEMIND_CHAT_API_KEY).
- **the agent**: `front_agent(config, useragent, **settings)` builds the one
  HiveMindChatAgent a front serves and shuts it down however the server ends.
- **how it stops**: `serve_until_signalled(serve, uri)` runs `serve(stopping)` on an event
  loop. SIGINT (Ctrl-C) or SIGTERM (systemd, docker stop) sets `stopping`: the front stops
  accepting and lets what is in flight finish (drain); `DRAIN_SECONDS` later, or at a second
  signal, the server is cancelled (its turns stopped at the hub). Either way exit code 0; an
  address that cannot be listened on is a ConfigurationError naming it.

A new front's command line is then (bridges/openai_http.serve_from_cli is the whole of one):

    def serve_from_cli(args, out, config) -> int:
        where = serving.parse_uri(args.uri, "--uri", ("http",), "http://127.0.0.1:9000")
        keys = serving.read_keys(args.api_key, args.api_key_file)
        serving.check_exposure(where.host, keys)
        with serving.front_agent(config, "hivemind-chat-a2a") as agent:
            out.info(f"A2A server on {args.uri}")
            return serving.serve_until_signalled(
                lambda stopping: my_server(agent, where, keys, stopping), args.uri)

and bridges/cli.py's SERVERS names its module. Only the standard library is imported here at
the top (and core/, which imports no other library), so a front's options parse where its
extra is missing.
"""
import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Iterator, List, Optional
from urllib.parse import urlparse

from hivemind_chat_agent.core.front_guard import Keys, is_loopback
from hivemind_chat_agent.errors import ConfigurationError

API_KEY_ENV = "HIVEMIND_CHAT_API_KEY"   # an API key of the HTTP fronts, besides --api-key
DRAIN_SECONDS = 10.0     # what is in flight at a stop signal has this long to finish
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Serve = Callable[[asyncio.Event], Awaitable[None]]

__all__ = ["Address", "parse_uri", "is_loopback", "check_exposure", "add_key_options",
           "read_keys", "front_agent", "serve_until_signalled", "until_stopping",
           "API_KEY_ENV", "DRAIN_SECONDS"]


@dataclass(frozen=True)
class Address:
    """Where a front listens: its URI's scheme, host and port."""
    scheme: str
    host: str
    port: int


def parse_uri(uri: str, option: str, schemes: Collection[str], example: str,
              default_host: Optional[str] = None) -> Address:
    """`uri` as SCHEME://HOST:PORT for one of `schemes`; `default_host` where the URI may
    leave the host out (tcp://:10700). ConfigurationError naming `option` and `example`
    otherwise."""
    try:
        parsed = urlparse(uri)
        port = parsed.port
    except ValueError:          # a port that is not a number, or out of range
        port = None
        parsed = None
    host = (parsed.hostname if parsed is not None else None) or default_host
    if parsed is None or parsed.scheme not in schemes or port is None or not host:
        raise ConfigurationError(f"{option} must look like {example}, not {uri!r}")
    return Address(parsed.scheme, host, port)


def check_exposure(host: str, keys: Keys, env: str = API_KEY_ENV) -> None:
    """Anyone who reaches the server talks to the hub as this client: beyond loopback only
    with a key (ConfigurationError saying how to give one)."""
    if not is_loopback(host) and not keys:
        raise ConfigurationError(
            f"refusing to listen on {host} without an API key: anyone reaching it would talk "
            f"to the hub as this client; pass --api-key, --api-key-file or set {env}")


def add_key_options(p) -> None:
    """--api-key and --api-key-file, for every front whose callers send a Bearer key."""
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help=f"a key clients must send as a Bearer token (repeatable: each key is "
                        f"its own set of conversations; or set {API_KEY_ENV}); on the command "
                        "line it shows in the process list, prefer --api-key-file")
    p.add_argument("--api-key-file", action="append", default=[], metavar="PATH",
                   help="a file of keys, one per line (repeatable)")


def seconds_option(text: str) -> float:
    """argparse type of the fronts' SECONDS options: a number above 0."""
    import argparse
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def count_option(text: str) -> int:
    """argparse type of the fronts' N options (caps): a whole number of at least 1."""
    import argparse
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def read_keys(given: List[str], files: List[str], env: str = API_KEY_ENV) -> Keys:
    """The API keys from the command line, key files (one per line, # comments) and the
    environment variable; a file that cannot be read is a ConfigurationError."""
    keys = list(given)
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                keys += [line.strip() for line in f
                         if line.strip() and not line.lstrip().startswith("#")]
        except OSError as e:
            raise ConfigurationError(f"cannot read the API key file {path}: "
                                     f"{e.strerror or e}") from None
    if os.environ.get(env, "").strip():
        keys.append(os.environ[env].strip())
    return Keys(keys)


@contextlib.contextmanager
def front_agent(config: dict, useragent: str, observer: Any = None,
                **settings: Any) -> Iterator[Any]:
    """The HiveMindChatAgent a front serves: the CLI's agent `config`, the front's
    `useragent`, and its own `settings` (None leaves the config's), reporting to `observer`
    (the front's metrics, when `--metrics` asked for them); shut down on leaving, however the
    server ended."""
    from hivemind_chat_agent.client.agent import HiveMindChatAgent
    agent = HiveMindChatAgent({**config, "useragent": useragent,
                               **{k: v for k, v in settings.items() if v is not None}})
    if observer is not None:
        agent.observe(observer)
    try:
        yield agent
    finally:
        agent.shutdown()


def serve_until_signalled(serve: Serve, uri: str, drain: float = DRAIN_SECONDS) -> int:
    """Run `serve(stopping)` on a new event loop until it returns, or a stop signal ends it:
    the first SIGINT or SIGTERM sets `stopping` (the front drains), `drain` seconds later or
    at a second signal it is cancelled. Exit code 0; an address that cannot be listened on is
    a ConfigurationError naming `uri`. Call it from the main thread (elsewhere no handler can
    be installed: the server then runs until it returns)."""
    from hivemind_chat_agent import background
    background.unblock_signals()        # every thread of ours is started: signals are ours
    try:
        asyncio.run(_serve_until_signalled(serve, drain))
    except OSError as e:
        raise ConfigurationError(f"cannot listen on {uri}: {e.strerror or e}") from None
    except KeyboardInterrupt:           # before the handlers were in place, or after
        pass
    return 0


async def _serve_until_signalled(serve: Serve, drain: float) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    server = asyncio.ensure_future(serve(stopping))

    def on_signal() -> None:
        if stopping.is_set():           # asked twice: stop now
            server.cancel()
            return
        stopping.set()
        loop.call_later(drain, server.cancel)
    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):   # not the main thread
            pass
    try:
        await server
    except asyncio.CancelledError:
        if not stopping.is_set():       # cancelled from outside, not by a signal
            raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def until_stopping(work: Awaitable[None], stopping: asyncio.Event) -> None:
    """Run `work` until it ends or `stopping` is set, then cancel it: for a server with
    nothing to drain (one MCP client over stdio)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, stop, return_exceptions=True)
    if not task.cancelled():
        task.result()
