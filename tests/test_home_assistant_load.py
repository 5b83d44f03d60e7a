"""No turn lost on the stable HiveMind install (hivemind-core 4.0.0, a genuine ovos-messagebus
with an answering service; tests/stock_hub.py), and on the current line (5.3.10a1 and its
ovos-messagebus), with our plugin in its OVOS mode in front of the
bus, driven through the Wyoming front as Home Assistant drives it: 20 new conversations one
after another, 20 at once, then 40 turns of the first 20 (their connections evicted and
reopened: max_connections), while a CPU burner occupies one of the machine's cores.

The stock hivemind-ovos-agent-plugin 0.1.0 in the same place forwards replies on its OVOS bus
thread and iterates hivemind-core's client table there: under the same burner it lost turns in
most runs (tornado's iostream AssertionError in the hub log), which no client can prevent; it is
measured beside the OVOS mode by benchmarks/bench_ha_load.py, not asserted here. The client's
own guard for that plugin (client/churn_gate.py) keeps its unit tests.
"""
import pytest
from cpu_burner import cpu_burner
from home_assistant import Server, load_phases
from hubs import hub_generations
from stock_hub import STOCK_PLUGIN_RACES, StockOVOSHub

from hivemind_chat_agent import HiveMindChatAgent

pytestmark = pytest.mark.hub
RACES = STOCK_PLUGIN_RACES + ("Traceback",)


@pytest.fixture(scope="module", params=hub_generations())
def ovos_mode_hub(request):
    hub = StockOVOSHub(plugin="ovos-mode", generation=request.param).start()
    yield hub
    hub.cleanup()


@pytest.mark.parametrize("run", range(5))
def test_home_assistant_load_loses_no_turn_through_the_ovos_mode_under_a_cpu_burner(
        ovos_mode_hub, run):
    agent = HiveMindChatAgent(ovos_mode_hub.add_client().agent_config(timeout=10))
    server = Server(agent)
    try:
        with cpu_burner():
            lost = load_phases(server.port, f"run{run}", lambda phase, i: f"{phase} {i}",
                               lambda said, reply: f"you said {said}" in reply)
        assert lost == []
    finally:
        server.stop()
        agent.shutdown()
    log = ovos_mode_hub.logs()
    assert not [race for race in RACES if race in log], log[-3000:]
