"""core/skills_readiness.SkillsReadiness with hand-given times: probes after each connect,
every `every` seconds until a true answer; a false or foreign answer changes nothing; one
WARNING per outage once it lasts `warn_after`."""
from hivemind_chat_agent.core.skills_readiness import ANSWER_TYPE, PROBE_TYPE, SkillsReadiness


def answer(status):
    return {"type": ANSWER_TYPE, "data": {"status": status}, "context": {}}


def test_probes_follow_each_connect_until_the_skills_say_ready():
    readiness = SkillsReadiness(every=0.5, warn_after=30.0)
    assert readiness.probe_due(0.0) is None            # no bus: nothing to ask
    readiness.bus_up(10.0)
    assert readiness.probe_due(10.0)["type"] == PROBE_TYPE
    assert readiness.probe_due(10.2) is None
    assert abs(readiness.seconds_to_next_probe(10.2) - 0.3) < 1e-9
    assert readiness.probe_due(10.5)["type"] == PROBE_TYPE
    assert not readiness.answered(answer(False))         # loading: not yet
    assert not readiness.answered({"type": "speak", "data": {"status": True}})
    assert not readiness.ready
    assert readiness.answered(answer(True)) and readiness.ready
    assert readiness.probe_due(11.0) is None and readiness.seconds_to_next_probe(11.0) is None
    assert not readiness.answered(answer(True))          # once
    readiness.bus_down()
    assert not readiness.ready and readiness.probe_due(12.0) is None
    readiness.bus_up(13.0)
    assert not readiness.ready and readiness.probe_due(13.0) is not None


def test_one_warning_per_outage_once_it_lasts():
    readiness = SkillsReadiness(every=0.5, warn_after=30.0)
    readiness.bus_up(0.0)
    assert not readiness.overdue(29.9)
    assert readiness.overdue(30.0)
    assert not readiness.overdue(45.0)
    readiness.bus_down()
    readiness.bus_up(50.0)
    assert not readiness.overdue(60.0) and readiness.overdue(80.0)
