"""What a test checks is left behind once an agent has shut down: the client's threads."""
import threading

from waiting import wait_until


def agent_threads() -> set:
    """The threads the client runs: its own (named hivemind-chat...) and the websocket
    library's ping thread."""
    return {t for t in threading.enumerate()
            if t.name.startswith("hivemind-chat") or "_send_ping" in t.name}


def threads_left(before: set, timeout: float = 5.0) -> set:
    """The client threads started since `before` that are still alive once they had `timeout`
    seconds to end (empty as soon as they all have: shutdown joins them, a daemon thread may
    need a moment more to leave)."""
    wait_until(lambda: not agent_threads() - before, timeout)
    return agent_threads() - before
