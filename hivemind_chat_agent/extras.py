"""Which optional parts of the package need which extra, and the error that names it.

`pip install hivemind-chat-agent` is the client (the OPM chat plugin, `hivemind-chat`, both
handshakes, the session store). Each other role is an extra of setup.py; a command or name that
needs one checks for its modules first, so a person reads which extra to install instead of a
traceback from deep inside an import.
"""
import importlib.util
from typing import Dict, List, Tuple

from hivemind_chat_agent.errors import MissingExtraError

# extra -> the top-level modules it provides that the code imports
EXTRA_MODULES: Dict[str, Tuple[str, ...]] = {
    "hub": ("hivemind_plugin_manager",),
    "demo": ("hivemind_core", "hivemind_plugin_manager", "hivemind_websocket_protocol",
             "tornado", "aiml"),
    "wyoming": ("wyoming",),
    "zeroconf": ("zeroconf",),
    "redis": ("redis",),
    "openai": ("starlette", "uvicorn"),
    "mcp": ("mcp",),
    "a2a": ("a2a", "starlette", "sse_starlette", "uvicorn"),
    "metrics": ("prometheus_client",),
    "mqtt": ("paho",),
}


def missing_modules(extra: str) -> List[str]:
    """The modules of `extra` that cannot be imported here (none when the extra is installed)."""
    return [m for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]


def install_hint(extra: str) -> str:
    return f'pip install "hivemind-chat-agent[{extra}]"'


def require(extra: str, what: str) -> None:
    """Raise MissingExtraError naming `extra` unless all its modules can be imported."""
    absent = missing_modules(extra)
    if absent:
        raise MissingExtraError(
            f"{what} needs the [{extra}] extra, which is not installed here (missing: "
            f"{', '.join(absent)}): {install_hint(extra)}", name=absent[0])
