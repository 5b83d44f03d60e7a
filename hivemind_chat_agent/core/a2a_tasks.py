"""The A2A front's bookkeeping, with no I/O: which task is in which state, which OVOS session a
`contextId` is, what a message naming a task means, and which tasks the bounded store forgets.

- A `contextId` is one conversation: one OVOS session of the agent, named from the caller (its
  API key, core/front_guard.Keys.caller) and the context, so the same context of the same key
  is the same session after a restart too (the agent's session store keeps it), and another key
  never reaches it.
- A message naming a task continues it only while that task waits for an answer
  (`input-required`: a skill asked, OVOS's get_response); the answer is then a turn of the same
  session. A task still answering, or ended, is not continued (`Refused`), nor one of another
  context.
- Tasks are kept at most `max_tasks` (running ones always), the least recently changed ended or
  waiting ones forgotten first; an ended or waiting task is also forgotten `keep_for` seconds
  after its last change (OVOS gave up waiting for the answer long before).
"""
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

WORKING = "working"
INPUT_REQUIRED = "input-required"
# the A2A states after which a task takes no more messages
ENDED = frozenset({"completed", "failed", "canceled", "rejected"})

NEW, ANSWER = "new", "answer"


class Refused(Exception):
    """A message that names a task this front will not continue; the words say why."""


@dataclass
class TaskEntry:
    caller: str
    context_id: str
    state: str
    changed: float


class TaskBook:
    """What the front knows about its tasks; `clock` gives seconds (monotonic)."""

    def __init__(self, max_tasks: int = 1000, keep_for: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic):
        if max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self.max_tasks, self.keep_for, self.clock = max_tasks, keep_for, clock
        self._tasks: "OrderedDict[str, TaskEntry]" = OrderedDict()
        # the ended or waiting ones, least recently changed first: what may be forgotten, in
        # the order it is (the store saves a task at every event, so no save scans them all)
        self._idle: "OrderedDict[str, None]" = OrderedDict()

    @staticmethod
    def session_for(caller: str, context_id: str) -> str:
        """The OVOS session of `context_id` for `caller`: stable, short, and apart per key."""
        digest = hashlib.sha256(f"{caller}\n{context_id}".encode()).hexdigest()[:24]
        return f"a2a-{digest}"

    def meaning(self, caller: str, task_id: str, context_id: str) -> str:
        """What a message for `task_id` in `context_id` is: NEW (a task not known here: its
        first message) or ANSWER (the task waits for the answer to its question). Refused
        for a task that is answering, ended, or of another caller or context."""
        entry = self._tasks.get(task_id)
        if entry is None:
            return NEW
        if entry.caller != caller:
            raise Refused(f"task {task_id} is not known")
        if entry.context_id != context_id:
            raise Refused(f"task {task_id} belongs to another context")
        if entry.state == INPUT_REQUIRED:
            return ANSWER
        if entry.state in ENDED:
            raise Refused(f"task {task_id} has ended ({entry.state}): send a new message "
                          "in its context instead")
        raise Refused(f"task {task_id} is still answering: wait for it or cancel it")

    def state_of(self, task_id: str) -> Optional[str]:
        entry = self._tasks.get(task_id)
        return entry.state if entry else None

    def stored(self, task_id: str, caller: str, context_id: str,
               state: str) -> List[Tuple[str, str]]:
        """The store saved `task_id` in `state`; returns the (task_id, caller) pairs to forget
        now (expired, or beyond the bound), never a running task's."""
        self.forget(task_id)
        self._tasks[task_id] = TaskEntry(caller, context_id, state, self.clock())
        if state in ENDED or state == INPUT_REQUIRED:
            self._idle[task_id] = None
        return self._prune()

    def forget(self, task_id: str) -> None:
        self._tasks.pop(task_id, None)
        self._idle.pop(task_id, None)

    def __len__(self) -> int:
        return len(self._tasks)

    def _prune(self) -> List[Tuple[str, str]]:
        """The expired idle tasks (the oldest changes: a prefix of `_idle`), then the oldest
        idle ones while more than `max_tasks` are kept."""
        now, gone = self.clock(), []
        while self._idle:
            oldest = next(iter(self._idle))
            if now - self._tasks[oldest].changed < self.keep_for and \
                    len(self._tasks) <= self.max_tasks:
                break
            gone.append((oldest, self._tasks[oldest].caller))
            self.forget(oldest)
        return gone


__all__ = ["TaskBook", "TaskEntry", "Refused", "NEW", "ANSWER", "WORKING", "INPUT_REQUIRED",
           "ENDED"]
