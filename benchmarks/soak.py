"""Soak: many concurrent sessions through one agent, against a genuine hivemind-core 4.0 hub.

    python benchmarks/soak.py [--sessions 64] [--turns-per-session 160] [--max-connections 16]
    python benchmarks/soak.py --quick          (8 sessions x 20 turns, 4 connections)

The hub is hivemind-core 4.0's own listener in its own process on 127.0.0.1, answering with the
OVOS-like test pipeline (tests/pipeline_agent.py, through tests/hubs.py's `HubProcess`). One
`HiveMindChatAgent` serves every session; each session runs on its own thread and takes turns
whose answers name their session and turn, so an answer that reaches the wrong caller is seen:

  echo s<i> t<t>       -> "you said echo s<i> t<t>"               (most turns)
  count N              -> "sentence 1" .. "sentence N", in order  (duplicates, order, gaps)
  whoami               -> "session soak-<i>"
  remember s<i>m<t>    -> "I will remember that"; a few turns later
  recall               -> "you said s<i>m<t>": the conversation's Session (client-side state,
                          carried in every HELLO and utterance) survived the connection churn
                          and was never mixed with another session's

The pool is smaller than the number of sessions (`--max-connections`), and the run alternates
between two phases (`--phase-seconds` each): "wide", every session takes turns at once, so
nearly every turn finds its connection evicted (LRU) and reconnects; "narrow", at most
`--max-connections` sessions are admitted at a time, each for a burst of turns, so connections
are reused and only the ones of sessions leaving are evicted. Idle connections are also closed
by the agent's reaper (`--idle-timeout`).

Tracked: turns, misrouted answers (a sentence of another session or another turn), lost turns
(exceptions, by type), duplicated / out-of-order / missing sentences, memory (recall) failures,
and, sampled every `--sample-seconds`, the client's RSS, threads and open file descriptors and
the hub's RSS. After `agent.shutdown()` the client's file descriptors and threads must be back
to the baseline taken before the agent was created (with nothing but a garbage collection it
does not force). Exit code 0 only if nothing was misrouted, lost, duplicated, reordered or
forgotten and fds and threads are back to the baseline.
"""
import argparse
import collections
import gc
import os
import random
import re
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from hubs import HubProcess  # noqa: E402
from ovos_bus_client.session import SessionManager  # noqa: E402
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

SID = "soak-{}"


# ---------------------------------------------------------------- process figures
def rss_mib(pid="self") -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid="self") -> float:
    """User + system CPU time of a process (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def os_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def open_fds() -> dict:
    """fd number -> what it points at (socket:[inode], a path, pipe:[...])."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:     # the fd listdir itself used, closed by now
            pass
    return fds


def object_census() -> collections.Counter:
    """Live objects tracked by the garbage collector, by type name."""
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def thread_names() -> dict:
    return {t.ident: t.name for t in threading.enumerate()}


class Sample:
    __slots__ = ("at", "turns", "rss", "threads", "os_threads", "fds", "pool", "hub_rss")

    def __init__(self, at, turns, agent, hub_pid):
        self.at = at
        self.turns = turns
        self.rss = rss_mib()
        self.threads = threading.active_count()
        self.os_threads = os_threads()
        self.fds = len(open_fds())
        self.pool = len(agent.pool) if agent is not None else 0
        self.hub_rss = rss_mib(hub_pid)


# ---------------------------------------------------------------- what each turn expects
class Plan:
    """One session's turns, decided up front from its own seeded RNG.

    A session remembers one token (its first turn) and recalls it now and then: the test
    pipeline's "recall" answers with the *oldest* value remembered in the Session (each
    "remember" pushes a new context frame in front, and it reads the last frame), so one token
    per session keeps the expectation exact."""

    def __init__(self, index: int, turns: int, seed: int):
        self.index = index
        self.turns = turns
        self.rng = random.Random(seed * 1000 + index)
        self.token = None            # what the hub confirmed storing in this Session
        self.uncertain = False       # a remember turn failed: the hub may hold it or not

    def turn(self, t: int):
        """(kind, utterance, expected sentences; None: the answer cannot be predicted)"""
        i = self.index
        r = self.rng.random()
        if self.token is None and not self.uncertain:
            return "remember", f"remember s{i}m{t}", ["I will remember that"]
        if r < 0.07:
            return "recall", "recall", None if self.uncertain else [f"you said {self.token}"]
        if r < 0.32:
            n = self.rng.randint(2, 6)
            return "count", f"count {n}", [f"sentence {k}" for k in range(1, n + 1)]
        if r < 0.40:
            return "whoami", "whoami", [f"session {SID.format(i)}"]
        return "echo", f"echo s{i} t{t}", [f"you said echo s{i} t{t}"]

    def remembered(self, t: int, ok: bool):
        if ok:
            self.token = f"s{self.index}m{t}"
        else:
            self.uncertain = True


ECHO = re.compile(r"^you said echo s(\d+) t(\d+)$")
WHO = re.compile(r"^session soak-(\d+)$")
MEM = re.compile(r"^you said s(\d+)m(\d+)$")
SENTENCE = re.compile(r"^sentence (\d+)$")


def owner(sentence: str):
    """(session index, turn) a sentence can be traced to; (None, None) if it names neither."""
    for pattern in (ECHO, MEM):
        m = pattern.match(sentence)
        if m:
            return int(m.group(1)), int(m.group(2))
    m = WHO.match(sentence)
    if m:
        return int(m.group(1)), None
    return None, None


def check(kind, index, t, expected, got):
    """Problems with one turn's answer: a list of (category, detail)."""
    if kind == "recall":
        if got == expected:
            return []
        if len(got) == 1 and (got[0] == "I remember nothing" or (
                MEM.match(got[0]) and owner(got[0])[0] == index)):
            if expected is None:           # after a failed remember: either is right
                return []
            return [("memory", f"session {index} turn {t}: expected {expected[0]!r}, "
                               f"got {got[0]!r}")]
    if got == expected:
        return []
    problems = []
    wanted = set(expected or [])
    for s in got:
        if s in wanted:
            continue
        who, turn = owner(s)
        if who is not None and who != index:
            problems.append(("misrouted", f"session {index} turn {t} ({kind}) got {s!r}, "
                                          f"an answer for session {who}"))
        elif who == index and turn is not None and turn != t:
            problems.append(("misrouted", f"session {index} turn {t} ({kind}) got {s!r}, "
                                          f"an answer to its own turn {turn}"))
        else:
            problems.append(("misrouted", f"session {index} turn {t} ({kind}) got {s!r}, "
                                          "which it did not ask for"))
    if expected is None:
        return problems
    mine = [s for s in got if s in wanted]
    counts = collections.Counter(mine)
    dups = [s for s, c in counts.items() if c > 1]
    if dups:
        problems.append(("duplicated", f"session {index} turn {t} ({kind}): {dups} twice+ "
                                       f"in {got}"))
    firsts = list(dict.fromkeys(mine))
    if firsts != [s for s in expected if s in counts]:
        problems.append(("out_of_order", f"session {index} turn {t} ({kind}): {got}"))
    missing = [s for s in expected if s not in counts]
    if missing:
        problems.append(("missing", f"session {index} turn {t} ({kind}): expected {expected}, "
                                    f"got {got}"))
    return problems


# ---------------------------------------------------------------- the soak
class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.turns = 0
        self.by_kind = collections.Counter()
        self.by_phase = collections.Counter()
        self.problems = collections.Counter()
        self.examples = collections.defaultdict(list)
        self.lost = collections.Counter()
        self.lost_examples = []
        self.latency = []
        self.unchecked = 0

    def done(self, kind, phase, seconds, problems):
        with self.lock:
            self.turns += 1
            self.by_kind[kind] += 1
            self.by_phase[phase] += 1
            self.latency.append(seconds)
            for category, detail in problems:
                self.problems[category] += 1
                if len(self.examples[category]) < 5:
                    self.examples[category].append(detail)

    def failed(self, error, index, t, kind, phase):
        with self.lock:
            name = type(error).__name__
            self.lost[name] += 1
            self.by_phase[phase + " (lost)"] += 1
            if len(self.lost_examples) < 8:
                self.lost_examples.append(f"session {index} turn {t} ({kind}, {phase}): "
                                          f"{name}: {str(error)[:160]}")


class Admission:
    """"wide": every session takes turns at once; "narrow": at most `limit` sessions at a time."""

    def __init__(self, limit: int):
        self.limit = limit
        self.narrow = False
        self.active = 0
        self.cond = threading.Condition()

    @property
    def phase(self):
        return "narrow" if self.narrow else "wide"

    def enter(self, stop: threading.Event):
        with self.cond:
            while self.narrow and self.active >= self.limit and not stop.is_set():
                self.cond.wait(0.5)
            self.active += 1

    def leave(self):
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def set_narrow(self, narrow: bool):
        with self.cond:
            self.narrow = narrow
            self.cond.notify_all()


def session_worker(agent, index, args, tally, admission, stop):
    plan = Plan(index, args.turns_per_session, args.seed)
    sid = SID.format(index)
    rng = random.Random(args.seed * 7919 + index)
    t = 0
    while t < args.turns_per_session and not stop.is_set():
        admission.enter(stop)
        try:
            for _ in range(args.burst):
                if t >= args.turns_per_session or stop.is_set():
                    break
                kind, utterance, expected = plan.turn(t)
                phase = admission.phase
                start = time.perf_counter()
                try:
                    got = list(agent.stream_sentences(
                        [AgentMessage(role=MessageRole.USER, content=utterance)],
                        session_id=sid))
                except Exception as e:      # every failure is a lost turn, by its type
                    tally.failed(e, index, t, kind, phase)
                    if kind == "remember":
                        plan.remembered(t, False)
                else:
                    problems = check(kind, index, t, expected, got)
                    if kind == "remember":
                        plan.remembered(t, not problems)
                    tally.done(kind, phase, time.perf_counter() - start, problems)
                    if expected is None:
                        with tally.lock:
                            tally.unchecked += 1
                t += 1
        finally:
            admission.leave()
        time.sleep(rng.uniform(0, 0.05))    # let another session in; shuffle the order


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def settle(baseline_fds: dict, baseline_threads: dict, seconds: float):
    """Wait (up to `seconds`) for fds and threads to come back down; (fds, threads) then."""
    deadline = time.monotonic() + seconds
    while True:
        fds, threads = open_fds(), thread_names()
        if (len(fds) <= len(baseline_fds) and len(threads) <= len(baseline_threads)) \
                or time.monotonic() > deadline:
            return fds, threads
        time.sleep(0.1)


def describe_extra(now: dict, base: dict, label: str) -> str:
    extra = {k: v for k, v in now.items() if k not in base}
    if not extra:
        return f"{label}: none"
    counts = collections.Counter(re.sub(r"\[\d+\]", "[...]", str(v)) for v in extra.values())
    return f"{label}: " + ", ".join(f"{n} x {what}" for what, n in counts.most_common())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns-per-session", type=int, default=160)
    ap.add_argument("--max-connections", type=int, default=16)
    ap.add_argument("--idle-timeout", type=float, default=5.0,
                    help="agent idle_timeout: the reaper closes connections idle this long")
    ap.add_argument("--timeout", type=float, default=30.0, help="agent turn timeout")
    ap.add_argument("--churn-guard", type=float, default=None,
                    help="agent churn_guard (default: the agent's; 0 also drops the 25 ms "
                         "spacing of overlapping turn starts)")
    ap.add_argument("--burst", type=int, default=8, help="turns a session takes per admission")
    ap.add_argument("--phase-seconds", type=float, default=15.0)
    ap.add_argument("--sample-seconds", type=float, default=2.0)
    ap.add_argument("--progress-seconds", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-level", default="ERROR")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 8 sessions x 20 turns, 4 connections, 3 s phases")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.turns_per_session = 8, 20
        args.max_connections, args.phase_seconds, args.burst = 4, 3.0, 5
        args.sample_seconds, args.progress_seconds = 0.5, 5.0
    LOG.set_level(args.log_level)
    total = args.sessions * args.turns_per_session
    print(f"soak: {args.sessions} sessions x {args.turns_per_session} turns = {total} turns, "
          f"max_connections={args.max_connections}, idle_timeout={args.idle_timeout:g} s, "
          f"timeout={args.timeout:g} s, "
          f"{'' if args.churn_guard is None else f'churn_guard={args.churn_guard:g} s, '}"
          f"phases of {args.phase_seconds:g} s (wide: all "
          f"sessions at once; narrow: <= {args.max_connections} sessions, bursts of "
          f"{args.burst}), hivemind-core hub with the test pipeline on 127.0.0.1", flush=True)

    hub = HubProcess().start()
    try:
        hub_rss_start = rss_mib(hub.proc.pid)
        creds = hub.add_client(name="soak")
        config = creds.agent_config(max_connections=args.max_connections,
                                    idle_timeout=args.idle_timeout, timeout=args.timeout)
        if args.churn_guard is not None:
            config["churn_guard"] = args.churn_guard

        # Baseline 0: nothing of the agent has run in this process yet. Then one agent does one
        # turn and shuts down (libraries initialise lazily: configuration, ciphers), and
        # baseline 1 is taken right before the soak's agent is created.
        fds0, threads0 = open_fds(), thread_names()
        warm = HiveMindChatAgent(dict(config))
        warm.get_response("hello", session_id="warmup")
        warm.shutdown()
        del warm
        time.sleep(0.5)
        gc.collect()
        fds1, threads1 = open_fds(), thread_names()
        rss1 = rss_mib()
        objects1, blocks1 = object_census(), sys.getallocatedblocks()

        agent = HiveMindChatAgent(dict(config))
        pool = agent.pool                        # counts connections opened (churn)

        tally, admission, stop = Tally(), Admission(args.max_connections), threading.Event()
        samples = [Sample(0.0, 0, agent, hub.proc.pid)]
        workers = [threading.Thread(target=session_worker, name=f"soak-session-{i}",
                                    args=(agent, i, args, tally, admission, stop), daemon=True)
                   for i in range(args.sessions)]
        cpu0, hub_cpu0 = cpu_seconds(), cpu_seconds(hub.proc.pid)
        t0 = time.monotonic()
        for w in workers:
            w.start()
        next_phase = t0 + args.phase_seconds
        next_progress = t0 + args.progress_seconds
        phases = 1
        while any(w.is_alive() for w in workers):
            time.sleep(args.sample_seconds)
            now = time.monotonic()
            samples.append(Sample(now - t0, tally.turns, agent, hub.proc.pid))
            if now >= next_progress:
                s = samples[-1]
                lost = sum(tally.lost.values())
                print(f"  {s.at:6.0f} s  {s.turns:6d}/{total} turns ({s.turns / s.at:5.1f}/s) "
                      f"[{admission.phase:6s} {admission.active:3d} in]  lost {lost}  problems "
                      f"{sum(tally.problems.values())}  connects {pool.connections_opened}  "
                      f"pool {s.pool}  "
                      f"RSS {s.rss:.1f} MiB  threads {s.threads}  fds {s.fds}  hub RSS "
                      f"{s.hub_rss:.1f} MiB", flush=True)
                next_progress = now + args.progress_seconds
            if now >= next_phase:
                admission.set_narrow(not admission.narrow)
                phases += 1
                next_phase = now + args.phase_seconds
        elapsed = time.monotonic() - t0
        cpu, hub_cpu = cpu_seconds() - cpu0, cpu_seconds(hub.proc.pid) - hub_cpu0
        for w in workers:
            w.join()
        end = Sample(elapsed, tally.turns, agent, hub.proc.pid)
        samples.append(end)

        shut_start = time.monotonic()
        agent.shutdown()
        shut_seconds = time.monotonic() - shut_start
        del workers
        fds2, threads2 = settle(fds1, threads1, 10.0)   # no forced garbage collection
        gc.collect()
        fds3, threads3 = settle(fds1, threads1, 2.0)
        rss_after = rss_mib()
        connects = pool.connections_opened
        agent = pool = None  # nothing of it left here
        gc.collect()
        objects2, blocks2 = object_census(), sys.getallocatedblocks()
        agent_sessions = sum(1 for sid in SessionManager.sessions if sid.startswith("soak-"))
        hub_rss_end = rss_mib(hub.proc.pid)
        hub_alive = hub.proc.poll() is None
    finally:
        hub.cleanup()

    # ------------------------------------------------------------ report
    lost = sum(tally.lost.values())
    p = tally.problems
    peak = lambda attr: max(getattr(s, attr) for s in samples)  # noqa: E731
    lat = tally.latency
    print()
    print(f"ran {elapsed:.1f} s for {tally.turns + lost} turns "
          f"({(tally.turns + lost) / elapsed:.1f} turns/s), {phases} phases, "
          f"{connects} connections opened (max_connections={args.max_connections}); "
          f"shutdown took {shut_seconds:.2f} s")
    print(f"CPU during the soak: client {cpu:.0f} s ({cpu / elapsed:.0%} of one core), hub "
          f"{hub_cpu:.0f} s ({hub_cpu / elapsed:.0%} of one core), {os.cpu_count()} cores")
    print(f"turns by kind: {dict(tally.by_kind)}; by phase: {dict(tally.by_phase)}")
    print(f"latency: p50 {percentile(lat, 0.5) * 1000:.0f} ms, p99 "
          f"{percentile(lat, 0.99) * 1000:.0f} ms, max {max(lat or [0]) * 1000:.0f} ms"
          + (f", mean {statistics.mean(lat) * 1000:.0f} ms" if lat else ""))
    rows = [
        ("turns answered", f"{tally.turns} of {total}", tally.turns + lost == total),
        ("misrouted", p["misrouted"], p["misrouted"] == 0),
        ("lost (exceptions)", f"{lost} {dict(tally.lost) if lost else ''}".strip(), lost == 0),
        ("duplicated", p["duplicated"], p["duplicated"] == 0),
        ("out of order", p["out_of_order"], p["out_of_order"] == 0),
        ("missing sentences", p["missing"], p["missing"] == 0),
        ("memory (recall) wrong", f"{p['memory']} ({tally.unchecked} recalls unchecked)",
         p["memory"] == 0),
        ("client RSS MiB start/peak/end",
         f"{samples[0].rss:.1f} / {peak('rss'):.1f} / {end.rss:.1f} "
         f"(before agent {rss1:.1f}, after shutdown {rss_after:.1f})", None),
        ("client threads start/peak/end",
         f"{samples[0].threads} / {peak('threads')} / {end.threads} "
         f"(OS threads peak {peak('os_threads')}; {args.sessions} are the soak's own)", None),
        ("client fds start/peak/end",
         f"{samples[0].fds} / {peak('fds')} / {end.fds} (pool peak {peak('pool')}, "
         f"end {end.pool})", None),
        ("fds after shutdown",
         f"{len(fds2)} (baseline {len(fds1)}; {len(fds3)} after gc.collect(); before any "
         f"agent {len(fds0)})", len(fds2) <= len(fds1)),
        ("threads after shutdown",
         f"{len(threads2)} (baseline {len(threads1)}; {len(threads3)} after gc.collect(); "
         f"before any agent {len(threads0)})", len(threads2) <= len(threads1)),
        ("python objects (gc) / blocks",
         f"{sum(objects2.values()) - sum(objects1.values()):+d} objects, "
         f"{blocks2 - blocks1:+d} allocated blocks after shutdown and `del agent` vs before "
         f"it; {agent_sessions} soak Sessions left in SessionManager", None),
        ("hub RSS MiB start/peak/end",
         f"{hub_rss_start:.1f} / {peak('hub_rss'):.1f} / {hub_rss_end:.1f}"
         f"{'' if hub_alive else ' (hub process died!)'}", hub_alive),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for name, value, ok in rows:
        mark = "" if ok is None else ("ok" if ok else "FAIL")
        print(f"  {name:<{width}}  {str(value):<60} {mark}")
    print()
    print(describe_extra(fds2, fds1, "fds left over vs baseline"))
    print(describe_extra(fds1, fds0, "fds the warm-up agent left (vs before any agent)"))
    print(describe_extra(threads2, threads1, "threads left over vs baseline"))
    print(describe_extra(threads1, threads0, "threads the warm-up agent left"))
    print(f"threads alive at the end: {sorted(set(threads2.values()))}")
    grown = (objects2 - objects1).most_common(8)
    print("object types grown vs before the agent: "
          + (", ".join(f"{name} +{n}" for name, n in grown) if grown else "none"))
    for category, examples in tally.examples.items():
        print(f"{category} examples:")
        for e in examples:
            print(f"    {e}")
    if tally.lost_examples:
        print("lost examples:")
        for e in tally.lost_examples:
            print(f"    {e}")
    ok = all(r[2] for r in rows if r[2] is not None)
    print(f"\nsoak {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
