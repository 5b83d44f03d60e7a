"""Memory of the hub's transcripts (core/transcript.py): 10,000 satellite sessions with 10
exchanges each, measured with tracemalloc against the raw bytes of their text in the same run.

    python benchmarks/bench_transcripts.py [--sessions 10000] [--turns 10]

Two loads: typical exchanges (a 40-byte utterance, a 200-byte answer) and the worst case the
bounds allow (every session full to history_bytes). The bound stated in docs/performance.md is
history_bytes of text per session plus the per-exchange overhead printed here."""
import argparse
import gc
import os
import sys
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hivemind_chat_agent.core.transcript import ANSWERED, Exchange, Transcripts  # noqa: E402


def fill(sessions: int, turns: int, user_len: int, answer_len: int, limit: int):
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    book = Transcripts(history_turns=turns, history_bytes=limit)
    for s in range(sessions):
        sid = f"sat-{s:016x}-kitchen-{s}"
        for t in range(turns):
            book.record(sid, Exchange(f"{t:04d}" + "u" * (user_len - 4),
                                      f"{s:08d}" + "a" * (answer_len - 8), ANSWERED))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    text = sum(e.size for sid in list(book._sessions) for e in book.history(sid))
    return used, text, len(book)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    print(f"{args.sessions} sessions x {args.turns} exchanges")
    print(f"{'load':<34}{'memory':>10}{'text':>10}{'ratio':>8}{'per exchange':>15}")
    for name, user_len, answer_len, limit in (
            ("typical (40 B + 200 B)", 40, 200, 32768),
            ("full to history_bytes (32 KiB)", 200, 3076, 32768)):
        used, text, sessions = fill(args.sessions, args.turns, user_len, answer_len, limit)
        overhead = (used - text) / (sessions * args.turns)
        print(f"{name:<34}{used / 2**20:>8.1f} MB{text / 2**20:>7.1f} MB{used / text:>7.2f}x"
              f"{overhead:>11.0f} B +text")


if __name__ == "__main__":
    main()
