"""The hub's WARNING lines about refusals, within core/log_budget's allowance per sender and
kind: a flooding satellite, or someone who knows an access key and not its password, cannot
bury the log (or fill the disk) with a line per message refused."""
from typing import Any

from ovos_utils.log import LOG

from hivemind_chat_agent.core.log_budget import LogBudget

REFUSALS = LogBudget()


def warn_refusal(kind: str, peer: Any, line: str) -> None:
    """LOG.warning(`line`) unless this peer's lines of this kind are over budget; `peer` is
    the raw name (the key), `line` already shows it bounded (core/limits.shown_name)."""
    note = REFUSALS.admit((kind, str(peer)[:256]))
    if note is not None:
        LOG.warning(line + note)
