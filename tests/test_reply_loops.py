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
    own = OwnLoop()
    try:
        clock, ran, later = PluginClock(own), [], threading.Event()
        clock.call_later(0.01, lambda: ran.append(("kept", threading.get_ident())))
        cancel_now = clock.call_later(0.0, lambda: ran.append(("cancelled at once", 0)))
        cancel_now()                      # before the loop has even armed it
        cancel_armed = clock.call_later(0.01, lambda: ran.append(("cancelled armed", 0)))
        held, cancelled = threading.Event(), threading.Event()

        def hold():                       # FIFO: runs once that timer is armed
            held.set()
            cancelled.wait(BOUND)
            time.sleep(0.02)              # on the loop: the timer falls due behind the cancel
        own.get().add_callback(hold)
        assert held.wait(BOUND)
        cancel_armed()                    # queued while the loop is held
        cancelled.set()
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
