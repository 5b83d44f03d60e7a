"""hub/reply_loops.py without a hub: which loop a message gets, where its callbacks and timers
run, in which order, and what a closed loop does. Every wait is on an event (bounded), never a
pause long enough to hope something happened."""
import asyncio
import threading
import time

from hivemind_chat_agent.hub.reply_loops import OwnLoop, PluginClock, loop_here

BOUND = 10.0    # seconds an event may take on a loaded machine; reached only on a failure


def ran_on(loop, count=1):
    """Callbacks handed to `loop` note (index, thread); returns the notes once `count` ran."""
    notes, done = [], threading.Event()

    def note(i):
        notes.append((i, threading.get_ident()))
        if len(notes) == count:
            done.set()
    for i in range(count):
        loop.add_callback(note, i)
    assert done.wait(BOUND)
    return notes


def test_a_thread_without_a_loop_gets_the_plugins_own_and_its_callbacks_run_there_in_order():
    own = OwnLoop()
    try:
        loop = loop_here(own)
        assert loop is own.get() and loop.thread_id != threading.get_ident()
        notes = ran_on(loop, 50)
        assert [i for i, _ in notes] == list(range(50))
        assert {thread for _, thread in notes} == {loop.thread_id}
    finally:
        own.close()


def test_a_thread_running_a_loop_gets_that_loop():
    own, found = OwnLoop(), []

    async def inside():
        found.append(loop_here(own))
    asyncio.run(inside())
    assert found[0].thread_id == threading.get_ident()
    assert own._running is None          # the plugin's own loop was never started


def test_a_timer_set_from_another_thread_runs_on_the_loop_and_a_cancel_holds():
    """Three timers set from this thread: one kept, one cancelled before the loop could arm
    it (the loop held meanwhile), one cancelled once armed and due (the loop held past its
    due time, so the cancel and the timer reach the loop together): only the first runs."""
    own = OwnLoop()
    try:
        clock, ran, later = PluginClock(own), [], threading.Event()
        clock.call_later(0.01, lambda: ran.append(("kept", threading.get_ident())))

        def hold_loop(until: threading.Event, then_sleep: float = 0.0) -> None:
            held = threading.Event()

            def hold():
                held.set()
                until.wait(BOUND)
                time.sleep(then_sleep)    # on the loop: a timer falls due meanwhile
            own.get().add_callback(hold)
            assert held.wait(BOUND)
        go = threading.Event()
        hold_loop(go)
        cancel_now = clock.call_later(0.0, lambda: ran.append(("cancelled at once", 0)))
        cancel_now()                      # its arming is queued behind the hold: never armed
        go.set()
        cancel_armed = clock.call_later(0.01, lambda: ran.append(("cancelled armed", 0)))
        go_again = threading.Event()
        hold_loop(go_again, then_sleep=0.02)     # FIFO: runs once that timer is armed
        cancel_armed()                    # while the loop is held; due when it returns
        go_again.set()
        clock.call_later(0.05, later.set)    # due after all of the above
        assert later.wait(BOUND)
        assert ran == [("kept", own.get().thread_id)]
    finally:
        own.close()


def test_a_timer_set_on_the_loops_thread_is_armed_there_and_cancels_there():
    own = OwnLoop()
    try:
        clock, ran, done = PluginClock(own), [], threading.Event()

        def on_loop():
            cancel = clock.call_later(0.0, lambda: ran.append("cancelled"))
            cancel()
            clock.call_later(0.01, done.set)
        own.get().add_callback(on_loop)
        assert done.wait(BOUND)
        assert ran == []
    finally:
        own.close()


def test_after_close_its_thread_is_gone_and_a_late_reply_is_dropped_quietly():
    own = OwnLoop()
    loop = own.get()
    thread = own._thread
    own.close()
    assert not thread.is_alive()
    loop.add_callback(lambda: None)      # a worker finishing after the shutdown: no error
    loop.call_later(0.0, lambda: None)
