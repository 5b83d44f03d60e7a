"""Run jobs on a bounded pool of threads, one key's jobs strictly in order, many keys at once.

The hub side needs exactly this: a satellite's turns must not overtake each other, satellites
must not wait for each other, and a flood must be refused instead of queued without limit.
"""
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Deque, Dict, Hashable

from ovos_utils.log import LOG


class QueueFull(Exception):
    """More jobs are waiting than the executor was allowed to hold."""


class KeyedSerialExecutor:
    def __init__(self, workers: int, max_pending: int, max_pending_per_key: int = 0,
                 name: str = "hivemind-chat-worker"):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._max_pending = max_pending
        self._max_per_key = max_pending_per_key or max_pending
        self._lock = threading.Lock()
        self._queues: Dict[Hashable, Deque[Callable[[], None]]] = {}
        self._pending = 0          # submitted, not yet started
        self._closed = False

    @property
    def pending(self) -> int:
        return self._pending

    def submit(self, key: Hashable, job: Callable[[], None]) -> None:
        """Queue `job` behind the other jobs of `key`; raises QueueFull when at the bound."""
        with self._lock:
            if self._closed:
                raise QueueFull("executor is shut down")
            if self._pending >= self._max_pending:
                raise QueueFull(f"{self._pending} turns already waiting")
            queue = self._queues.get(key)
            start = queue is None
            if start:
                queue = self._queues[key] = deque()
            elif len(queue) >= self._max_per_key:
                raise QueueFull(f"{len(queue)} turns of this session already waiting")
            queue.append(job)
            self._pending += 1
        if start:
            self._pool.submit(self._drain, key)

    def cancel(self, key: Hashable, job: Callable[[], None]) -> bool:
        """Drop a job that has not started (e.g. its turn already timed out), freeing its
        place in the bound; False if it is running or done."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is None or job not in queue:
                return False
            queue.remove(job)
            self._pending -= 1
            return True

    def _drain(self, key: Hashable) -> None:
        while True:
            with self._lock:
                queue = self._queues[key]
                if not queue:
                    del self._queues[key]
                    return
                job = queue.popleft()
                self._pending -= 1
            try:
                job()
            except Exception as e:  # a job reports its own failures; never kill the worker
                LOG.error(f"hub turn failed unexpectedly: {type(e).__name__}: {e}")

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            self._closed = True
            dropped = sum(len(q) for q in self._queues.values())
            for q in self._queues.values():
                q.clear()
            self._pending = 0
        if dropped:
            LOG.info(f"dropped {dropped} queued turns at shutdown")
        self._pool.shutdown(wait=wait, cancel_futures=True)
