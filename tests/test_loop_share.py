"""core/loop_share.LoopAllowance with a hand-moved clock, the settings, and compat.paced around a
handler's on_message: a connection within its share is never paused, one over it has its next
read put off until its debt is repaid, connections are charged apart."""
import asyncio

import pytest
from fake_clock import FakeClock

from hivemind_chat_agent import compat
from hivemind_chat_agent.core.loop_share import (
    MAX_PAUSE,
    REFUSAL_PAUSE,
    LoopAllowance,
    loop_pacing,
)
from hivemind_chat_agent.errors import ConfigurationError


def test_an_allowance_refills_at_its_share_up_to_its_burst():
    clock = FakeClock()
    allowance = LoopAllowance(share=0.25, burst=1.0, now=clock.now)
    allowance.charge(0.5)
    assert allowance.pause() == 0.0                  # within the burst
    allowance.charge(1.0)
    assert allowance.pause() == pytest.approx(2.0)   # 0.5 s of debt at 0.25 s a second
    clock.advance(1.0)
    assert allowance.pause() == pytest.approx(1.0)
    clock.advance(1.0)
    assert allowance.pause() == 0.0
    clock.advance(100.0)
    assert allowance.balance == pytest.approx(1.0)   # never more than the burst
    allowance.charge(100.0)
    assert allowance.pause() == MAX_PAUSE


def test_the_settings_default_turn_off_and_refuse_nonsense():
    assert loop_pacing({}) == (0.25, 1.0)
    assert loop_pacing({"loop_share": 0.1, "loop_burst": 0.2}) == (0.1, 0.2)
    assert loop_pacing({"loop_share": 0}) is None
    for bad in ({"loop_share": 1.5}, {"loop_share": -1}, {"loop_share": "x"},
                {"loop_burst": 0}):
        with pytest.raises(ConfigurationError, match="loop_share"):
            loop_pacing(bad)


class Connection:
    pass


class Handler:
    def __init__(self):
        self.client = Connection()


def test_paced_reads_put_off_only_the_connection_over_its_share():
    clock = FakeClock()

    def on_message(handler, message):
        clock.advance(message)       # the frame's handling takes `message` seconds
    wrapped = compat.paced(on_message, share=0.1, burst=0.05, clock=clock.now, cpu=clock.now)
    flooder, other = Handler(), Handler()
    assert wrapped(other, 0.01) is None
    assert wrapped(flooder, 0.04) is None            # within the burst
    pause = wrapped(flooder, 0.04)    # 0.026 s in debt (0.004 refilled meanwhile): 0.26 s
    assert asyncio.iscoroutine(pause)
    assert pause.cr_frame.f_locals["delay"] == pytest.approx(0.26, abs=0.001)
    pause.close()
    assert wrapped(other, 0.01) is None               # charged apart
    assert wrapped._hivemind_chat_paced


def test_a_handler_that_awaits_by_itself_is_left_to_its_pace():
    marker = object()
    wrapped = compat.paced(lambda h, m: marker, share=0.1, burst=0.01)
    assert wrapped(Handler(), "frame") is marker


def test_writing_a_connections_replies_is_charged_to_it():
    clock = FakeClock()
    wrapped = compat.paced(lambda h, m: clock.advance(m), share=0.1, burst=0.05,
                           clock=clock.now, cpu=clock.now)
    flooder = Handler()
    assert wrapped(flooder, 0.001) is None
    compat.charge_loop_time(flooder.client, 0.1)        # its answers took the loop 0.1 s
    pause = wrapped(flooder, 0.001)
    assert asyncio.iscoroutine(pause)
    pause.close()
    compat.charge_loop_time(Connection(), 1.0)           # one never paced: nothing to charge


def test_both_modes_read_the_pacing_with_their_other_settings():
    """A bad loop_share is refused where every other setting is, before the plugin loads its
    engine or opens its store."""
    from hivemind_chat_agent.hub.ovos_settings import OvosModeSettings
    from hivemind_chat_agent.hub.settings import HubSettings
    assert HubSettings.from_dict({"engine": "e"}).loop_pacing == (0.25, 1.0)
    assert OvosModeSettings.from_dict({"loop_share": 0}).loop_pacing is None
    for settings, config in ((HubSettings, {"engine": "e", "loop_share": 2}),
                             (OvosModeSettings, {"loop_burst": -1})):
        with pytest.raises(ConfigurationError, match="loop_share"):
            settings.from_dict(config)


def test_a_refused_connections_next_read_waits_whatever_its_balance():
    clock = FakeClock()
    refused = []

    def on_message(handler, message):       # the plugin refuses the frame `busy`
        if message == "refused":
            refused.append(compat.hold_reads(handler.client, REFUSAL_PAUSE))
    wrapped = compat.paced(on_message, share=0.25, burst=1.0, clock=clock.now,
                           cpu=clock.now)
    flooder, other = Handler(), Handler()
    pause = wrapped(flooder, "refused")        # its first frame: the allowance is there
    assert refused == [True]
    assert pause.cr_frame.f_locals["delay"] == pytest.approx(REFUSAL_PAUSE)
    pause.close()
    assert wrapped(other, "accepted") is None
    clock.advance(REFUSAL_PAUSE)
    assert wrapped(flooder, "accepted") is None
    assert compat.hold_reads(Connection(), REFUSAL_PAUSE) is False    # never paced


def test_a_hold_is_bounded_and_adds_to_no_debt():
    clock = FakeClock()
    allowance = LoopAllowance(share=0.25, burst=1.0, now=clock.now)
    allowance.hold(60.0)
    assert allowance.pause() == MAX_PAUSE
    allowance.charge(1.5)                   # 0.5 s of debt: 2 s to repay
    clock.advance(4.0)
    assert allowance.pause() == pytest.approx(1.0)    # the hold's rest, not the debt's
    clock.advance(1.0)
    assert allowance.pause() == 0.0
