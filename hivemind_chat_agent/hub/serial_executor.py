"""Run jobs on a bounded pool of threads: one key's jobs strictly in order, many keys at once,
and no group of keys able to starve the others.

The hub side needs exactly this: a satellite session's turns must not overtake each other
(key = session), sessions must not wait for each other, and one client (group = access key)
using a hundred session ids must not take every worker and the whole queue: each group may
run at most `workers_per_group` jobs at once and hold at most `max_pending_per_group` waiting,
and free workers serve the groups in turn. A flood is refused, never queued without limit.
"""
import threading
from collections import Counter, deque
from typing import Callable, Deque, Dict, Hashable, List, Optional, Set

from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.core.limits import shown


class QueueFull(Exception):
    """More jobs are waiting than the executor was allowed to hold."""


class KeyedSerialExecutor:
    def __init__(self, workers: int, max_pending: int, max_pending_per_key: int = 0,
                 max_pending_per_group: int = 0, workers_per_group: int = 0,
                 name: str = "hivemind-chat-worker"):
        self._workers = workers
        self._max_pending = max_pending
        self._max_per_key = max_pending_per_key or max_pending
        self._max_per_group = max_pending_per_group or max_pending
        self._workers_per_group = workers_per_group or workers
        self._name = name
        self._cond = threading.Condition()
        self._queues: Dict[Hashable, Deque[Callable[[], None]]] = {}
        self._group_of: Dict[Hashable, Hashable] = {}
        self._ready: Dict[Hashable, Deque[Hashable]] = {}    # group -> keys with jobs, idle
        self._turns: Deque[Hashable] = deque()                # groups with ready keys
        self._running: Set[Hashable] = set()                  # keys with a job running
        self._running_in: Counter = Counter()                 # group -> jobs running
        self._pending_in: Counter = Counter()                 # group -> jobs waiting
        self._pending = 0
        self._idle = 0                                        # workers waiting for a job
        self._threads: List[threading.Thread] = []
        self._closed = False

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def idle(self) -> int:
        """Workers waiting for a job."""
        return self._idle

    def submit(self, key: Hashable, job: Callable[[], None], group: Hashable = None,
               at_once: Optional[Callable[[], None]] = None) -> None:
        """Queue `job` behind the other jobs of `key`; raises QueueFull when at a bound.
        `at_once`: called (under the executor's lock, so it must not wait) once the job is
        accepted and only if a free worker will pick it up now (nothing of `key` queued or
        running, its group under its worker cap, a worker idle or yet to start), before any
        worker can see it: the hub sends a turn's first store round trip there, to overlap
        the hand-off (hub/turn_runner.py)."""
        group = key if group is None else group
        with self._cond:
            if self._closed:
                raise QueueFull("executor is shut down")
            if self._pending >= self._max_pending:
                raise QueueFull(f"{self._pending} turns already waiting")
            if self._pending_in[group] >= self._max_per_group:
                raise QueueFull(f"{self._pending_in[group]} turns of this client already "
                                "waiting")
            queue = self._queues.get(key)
            if queue is not None and len(queue) >= self._max_per_key:
                raise QueueFull(f"{len(queue)} turns of this session already waiting")
            if at_once is not None and queue is None and key not in self._running and \
                    self._free_for(group):
                at_once()
            if queue is None:
                queue = self._queues[key] = deque()
                self._group_of[key] = group
            queue.append(job)
            self._pending += 1
            self._pending_in[group] += 1
            if key not in self._running and len(queue) == 1:
                self._make_ready(group, key)
            self._start_workers()
            self._cond.notify()

    def cancel(self, key: Hashable, job: Callable[[], None]) -> bool:
        """Drop a job that has not started (e.g. its turn already timed out), freeing its
        place in the bounds; False if it is running or done."""
        with self._cond:
            queue = self._queues.get(key)
            if queue is None or job not in queue:
                return False
            queue.remove(job)
            group = self._group_of[key]
            self._pending -= 1
            self._pending_in[group] -= 1
            if not self._pending_in[group]:
                del self._pending_in[group]
            if not queue and key not in self._running:
                ready = self._ready.get(group)
                if ready is not None and key in ready:
                    ready.remove(key)
                    if not ready:
                        del self._ready[group]
                        self._turns.remove(group)
                self._forget(key)
            return True

    def shutdown(self, wait: bool = True) -> None:
        with self._cond:
            self._closed = True
            dropped = self._pending
            self._queues.clear()
            self._ready.clear()
            self._turns.clear()
            self._pending = 0
            self._pending_in.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        if dropped:
            LOG.info(f"dropped {dropped} queued turns at shutdown")
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join(timeout=5)

    # ---- under the lock ----
    def _free_for(self, group: Hashable) -> bool:
        """A worker is free for a new key of `group` beyond the keys already ready that a
        worker may take (a woken worker takes the lock again only later): more workers idle
        or yet to start than those keys, and the group under its worker cap counting its
        ready keys. The groups with ready keys while a worker idles are at their cap, so the
        sum runs over a few of them."""
        free = self._idle + self._workers - len(self._threads)
        cap = self._workers_per_group
        if free <= 0 or self._running_in[group] + len(self._ready.get(group, ())) >= cap:
            return False
        takeable = sum(min(len(self._ready[g]), cap - self._running_in[g])
                       for g in self._turns if self._running_in[g] < cap)
        return free > takeable

    def _make_ready(self, group: Hashable, key: Hashable) -> None:
        ready = self._ready.get(group)
        if ready is None:
            ready = self._ready[group] = deque()
            self._turns.append(group)
        ready.append(key)

    def _forget(self, key: Hashable) -> None:
        self._queues.pop(key, None)
        self._group_of.pop(key, None)

    def _next(self) -> Optional[tuple]:
        """The next (group, key, job): groups in turn, skipping those at their worker cap."""
        for _ in range(len(self._turns)):
            group = self._turns[0]
            self._turns.rotate(-1)
            if self._running_in[group] >= self._workers_per_group:
                continue
            ready = self._ready[group]
            key = ready.popleft()
            if not ready:
                del self._ready[group]
                self._turns.remove(group)
            job = self._queues[key].popleft()
            self._pending -= 1
            self._pending_in[group] -= 1
            if not self._pending_in[group]:
                del self._pending_in[group]
            self._running.add(key)
            self._running_in[group] += 1
            return group, key, job
        return None

    def _start_workers(self) -> None:
        while len(self._threads) < self._workers:
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"{self._name}-{len(self._threads)}")
            self._threads.append(thread)
            background.start(thread)

    # ---- worker threads ----
    def _work(self) -> None:
        while True:
            with self._cond:
                picked = None
                while not self._closed and picked is None:
                    picked = self._next()
                    if picked is None:
                        self._idle += 1
                        self._cond.wait()
                        self._idle -= 1
                if picked is None:
                    return
            group, key, job = picked
            try:
                job()
            except Exception as e:  # a job reports its own failures; never kill the worker
                LOG.error(f"hub turn failed unexpectedly: {type(e).__name__}: "
                          f"{shown(str(e), 200, quote=False)}")
            with self._cond:
                self._running.discard(key)
                self._running_in[group] -= 1
                if not self._running_in[group]:
                    del self._running_in[group]
                queue = self._queues.get(key)
                if queue:
                    self._make_ready(group, key)
                elif queue is not None:
                    self._forget(key)
                self._cond.notify_all()
