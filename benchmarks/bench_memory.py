"""Client memory per conversation, and with 100,000 session_ids, bounded vs unbounded.

    python benchmarks/bench_memory.py [--sessions 100000] [--bound 10000]

No hub needed: it drives the agent's `SessionBook` the way turns do (a Session from the hub's
reply absorbed for each session_id, then `trim()` after the turn), and measures the Python heap
with tracemalloc. Baseline in the same run: the same session_ids with no bound, which is how the
agent behaved before (ovos-bus-client's SessionManager keeps every Session forever).
"""
import argparse
import gc
import os
import sys
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ovos_bus_client.session import Session, SessionManager  # noqa: E402

from hivemind_chat_agent.client.session_book import SessionBook  # noqa: E402


def hub_reply(sid: str) -> dict:
    """A Session as a hub sends it back after a turn: one active skill, a little context."""
    sess = Session(sid)
    sess.activate_skill("ovos-skill-hello-world.openvoiceos")
    sess.context.inject_context({"data": [["kitchen", "Room"]], "key": "Room",
                                 "confidence": 1.0})
    return sess.serialize()


def run(n: int, bound: int) -> tuple:
    for sid in [s for s in SessionManager.sessions if s.startswith("mem-")]:  # earlier runs
        del SessionManager.sessions[sid]
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    book = SessionBook("d", max_sessions=bound, idle_ttl=10 ** 9)
    template = hub_reply("mem-x")
    for i in range(n):
        sid = f"mem-{i}"
        book.for_turn(sid)
        book.absorb(sid, {**template, "session_id": sid})
        book.trim(keep={sid})
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    kept = len([s for s in SessionManager.sessions if s.startswith("mem-") and s != "mem-x"])
    return used, kept


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--bound", type=int, default=10_000)
    args = ap.parse_args()
    per_n = 10_000
    used, _ = run(per_n, 10 ** 9)
    per_session = used / per_n
    print(f"memory per idle conversation (tracemalloc, {per_n} sessions): "
          f"{per_session / 1024:.1f} KiB")
    bounded, kept_b = run(args.sessions, args.bound)
    unbounded, kept_u = run(args.sessions, 10 ** 9)
    limit = args.bound * per_session * 1.2
    ok = bounded <= limit and kept_b <= args.bound
    print(f"{args.sessions} session_ids, max_sessions={args.bound}: "
          f"{bounded / 2 ** 20:.1f} MiB, {kept_b} Sessions in SessionManager "
          f"(limit {limit / 2 ** 20:.1f} MiB: bound x per-session x 1.2) "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"baseline, same run, no bound: {unbounded / 2 ** 20:.1f} MiB, {kept_u} Sessions "
          f"({unbounded / max(bounded, 1):.1f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
