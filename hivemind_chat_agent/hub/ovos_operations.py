"""The OVOS mode as a service operators run: its health endpoint (`/healthz`, `/readyz`,
`/metrics`) and its drain on SIGTERM, as the chat mode has them (hub/protocol.py,
hub/draining.py; the names are docs/metrics.md's).

- **Ready** (core/health.ovos_readiness) while the local ovos-core takes utterances: its
  messagebus connected and its skills answering (core/skills_readiness.py), and the hub not
  draining. A load balancer in front of several OVOS hubs then sends no satellite to one whose
  ovos-core is down or restarting.
- **Metrics**: the chat mode's registry (hub/metrics.HubMetrics) with the OVOS mode's counts:
  an utterance is a turn, from the moment it was written to the bus to its `handled`
  (core/ovos_outcomes.py); refusals and utterances lost with the bus count as failed, with
  their reason; `hivemind_chat_turns_in_flight` is what is queued or at ovos-core;
  `hivemind_chat_sessions` the satellite sessions followed. There is no conversation store,
  so the store's series stay empty.
- **Draining** (core/drain.Drain through hub/draining.HubDrain, counted by the routes: an
  utterance counts until ovos-core handled it): at SIGTERM `/readyz` says draining at once, idle
  satellites are closed (1001), an utterance that arrives is refused with the `draining`
  reason (our client resends it to another hub; a stock satellite is told aloud first), and
  the process exits once the utterances at ovos-core were handled, or at `drain_timeout`.
"""
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent.core.health import Verdict, ovos_readiness, turn_outcome
from hivemind_chat_agent.core.ovos_replies import failure_replies
from hivemind_chat_agent.core.ovos_route_terms import Outbound, Refusal
from hivemind_chat_agent.core.protocol_names import CHAT_PLUGIN_NAME as PLUGIN_NAME
from hivemind_chat_agent.core.protocol_names import SPEAK_TYPE, TURN_TAG_KEY
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.hub.draining import DRAINING_SPEECH, DRAINING_WHY, DrainReport, HubDrain
from hivemind_chat_agent.hub.health_server import HealthServer
from hivemind_chat_agent.hub.metrics import NO_METRICS, HubMetrics, NoMetrics, connections
from hivemind_chat_agent.hub.ovos_settings import OvosModeSettings


def draining_replies(outbound: Outbound) -> List[Dict[str, Any]]:
    """What an utterance that reached a draining hub hears: the `draining` refusal, which our
    client (its turn tag says it is ours) sends to another hub at once; a stock satellite,
    which would only hear "not understood", is told aloud first, as the chat mode tells it."""
    replies = failure_replies(outbound, Refusal(EndReason.DRAINING, DRAINING_WHY))
    if isinstance(outbound.message["context"].get(TURN_TAG_KEY), str):
        return replies
    speech = dict(replies[0], type=SPEAK_TYPE, data={
        "utterance": DRAINING_SPEECH, "expect_response": False, "meta": {"skill": PLUGIN_NAME}})
    return [speech] + replies


class OvosOperations:
    """Health, metrics and drain of one OVOSModeProtocol. `clients`: hivemind-core's
    connection table; `fallback_loop`: where a connection with no loop of its own is closed;
    `utterances` and `sessions`: the routes' counts (core/ovos_routes.OvosRoutes), each read
    under the routes' lock, which nobody holds while calling in here."""

    def __init__(self, settings: OvosModeSettings, clients: Callable[[], Dict[str, Any]],
                 fallback_loop: Callable[[], Any],
                 utterances: Callable[[], Dict[str, int]], sessions: Callable[[], int]):
        self.settings = settings
        self._utterances = utterances
        self.metrics: NoMetrics = NO_METRICS
        if settings.health:
            from hivemind_chat_agent.extras import require
            require("metrics", f'the "health" endpoint of {PLUGIN_NAME}')
            self.metrics = HubMetrics(sessions=sessions, satellites=connections(clients),
                                      in_flight=lambda: sum(utterances().values()))
        self.drainer = HubDrain(settings.drain_timeout, lambda: clients().values(),
                                fallback_loop, count_turns=utterances)
        self._draining = threading.Event()
        self.serving = True
        self.health: Optional[HealthServer] = None

    def start_health(self, ovos_state: Callable[[], Tuple[bool, str]]) -> None:
        """The endpoint on its own thread, once everything it reports exists; `ovos_state`:
        (OVOS takes utterances, why not), read at each `/readyz`."""
        if not self.settings.health:
            return

        def ready() -> Verdict:
            answers, why = ovos_state()
            return ovos_readiness(answers, why, self.draining)
        self.health = self.settings.serve_health(ready, self.metrics)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def refused(self, reason: EndReason) -> None:
        """An utterance refused or lost (its failure is on its way)."""
        self.metrics.turn_ended(turn_outcome(failed=True, reason=reason), 0.0)
        if reason is EndReason.DRAINING:
            self.drainer.refused()

    def drain(self, shutdown: Callable[[], None]) -> DrainReport:
        """Drain (hub/draining.py: hivemind-core's SIGTERM ends here, before the process
        exits), then `shutdown`."""
        LOG.info(f"draining: {sum(self._utterances().values())} utterances at OVOS, up to "
                 f"{self.settings.drain_timeout:g} s")
        report = self.drainer.run(self._draining.set)
        LOG.info(f"drained in {report.seconds:.2f} s: {report.finished} utterances handled, "
                 f"{report.cut} cut at drain_timeout, {report.refused} refused, "
                 f"{report.closed} connections closed")
        shutdown()
        return report

    def stop(self) -> None:
        self.serving = False
        if self.health is not None:
            self.health.stop()
            self.health = None
