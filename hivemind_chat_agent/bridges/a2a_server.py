"""`hivemind-chat a2a`: an Agent2Agent server (the official `a2a-sdk`, extra `[a2a]`) in front of
the OVOS hub, so A2A clients (an OVOS persona with ovos-a2a-solver-plugin, a second HiveMind hub
with hivemind-a2a-agent-plugin, any agent) use the hub as an agent.

The SDK serves the protocol (its JSON-RPC routes, A2A 1.0 `SendMessage`/`SendStreamingMessage`
and the 0.3 names `message/send`/`message/stream`, `GetTask`, `CancelTask`, and the agent card
at its well-known path); `HubExecutor` is the agent behind it:
- each sentence the hub speaks is an artifact of its own, sent as an artifact update as it is
  spoken, then the task's final state: `completed`, `input-required` when a skill asked a
  question (the question is the task's last artifact), `canceled`, or `failed` with words
  naming the hub (bridges/hub_failures);
- a `contextId` is one OVOS session (core/a2a_tasks.TaskBook.session_for), a message without
  one starts a new context (the SDK names it);
- the next message naming a task that waits in `input-required` answers the question in the
  same session (OVOS's get_response), then the task ends as that turn does; what was said
  before moves from the task's artifacts into its history (turn_over), so its artifacts are
  always its last turn's;
- `CancelTask` stops the turn at the hub (ChatTurn.terminate, the barge-in);
- tasks live in a bounded store (`BoundedTaskStore`, the TaskBook deciding what it forgets).
A hub that cannot be reached before the task began is a JSON-RPC error naming it.

The HTTP app around it, its guard and the command line are bridges/a2a_http. Only the
standard library is imported at the top.
"""
import contextvars
import uuid
from typing import Any, Dict, List, cast

from hivemind_chat_agent.core.a2a_tasks import ANSWER, Refused, TaskBook


class RequestTurns:
    """The task ids whose turns one request began, and whether its caller has hung up
    (a2a_http.StopOnHangUp stops them then; a turn begun after that is stopped as it
    begins)."""

    def __init__(self) -> None:
        self.task_ids: List[str] = []
        self.gone = False


# the request's RequestTurns: the SDK runs the executor in a task of its own, which copies
# the request's context and so sees the request's object
REQUEST_TASKS: contextvars.ContextVar[RequestTurns] = contextvars.ContextVar("a2a_request_tasks")
RPC_PATH = "/"
CARD_PATH = "/.well-known/agent-card.json"
OLD_CARD_PATH = "/.well-known/agent.json"     # where A2A 0.2 clients look
DEFAULT_URI = "http://127.0.0.1:9999"
DESCRIPTION = ("An OVOS voice assistant hub, reached over HiveMind: its skills (time, weather, "
               "timers, alarms, music, smart home, or whatever it runs) answer what you say. "
               "A task in input-required means a skill asked a question: answer it with the "
               "next message of that task.")


def state_name(state: int) -> str:
    """A TaskState as the A2A spec spells it: TASK_STATE_INPUT_REQUIRED -> input-required."""
    from a2a.types import TaskState
    return TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")


def caller_of(call_context) -> str:
    """The guard's caller ("" without keys, "key-<hash>" with), as the SDK's user name."""
    return call_context.user.user_name if call_context is not None else ""


def agent_card(url: str, keyed: bool):
    """The card: one skill, streaming, text in and out, the Bearer scheme when keys are set."""
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        HTTPAuthSecurityScheme,
        SecurityRequirement,
        SecurityScheme,
        StringList,
    )
    card = AgentCard(
        name="HiveMind OVOS hub", description=DESCRIPTION, version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC",
                                             protocol_version="1.0"),
                              AgentInterface(url=url, protocol_binding="JSONRPC",
                                             protocol_version="0.3")],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="ask-ovos-hub", name="ask the OVOS hub",
                           description="Say something to the OVOS hub and get its spoken "
                                       "answer, sentence by sentence.",
                           tags=["ovos", "hivemind", "voice assistant"],
                           examples=["what time is it", "set a timer for 5 minutes"])])
    if keyed:
        card.security_schemes["bearer"].CopyFrom(SecurityScheme(
            http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="bearer", description="one of the server's API keys")))
        card.security_requirements.append(
            SecurityRequirement(schemes={"bearer": StringList(list=[])}))
    return card


def build_handler(executor: "HubExecutor", card=None):
    """The SDK's request handler around `executor` and a BoundedTaskStore of its book."""
    from a2a.server.agent_execution import AgentExecutor
    from a2a.server.request_handlers import DefaultRequestHandler
    AgentExecutor.register(HubExecutor)     # its two methods, without importing the SDK above
    return DefaultRequestHandler(agent_executor=cast(AgentExecutor, executor),
                                 task_store=bounded_store(executor.book),
                                 agent_card=card or agent_card(DEFAULT_URI, False))


def bounded_store(book: TaskBook):
    """The SDK's in-memory store, told by `book` which tasks to forget after each save."""
    from a2a.server.context import ServerCallContext
    from a2a.server.tasks import InMemoryTaskStore

    class BoundedTaskStore(InMemoryTaskStore):
        async def save(self, task, context) -> None:
            await super().save(task, context)
            gone = book.stored(task.id, caller_of(context), task.context_id,
                               state_name(task.status.state))
            for task_id, caller in gone:
                await super().delete(task_id, ServerCallContext(user=Caller(caller)))

    return BoundedTaskStore()


def Caller(name: str):
    """The SDK's User for the guard's caller `name`."""
    from a2a.auth.user import User

    class _Caller(User):
        @property
        def is_authenticated(self) -> bool:
            return bool(name)

        @property
        def user_name(self) -> str:
            return name

    return _Caller()


def turn_over(task) -> None:
    """`task`, waiting in input-required, as its answer begins the next turn: its artifacts
    (what the hub said before the answer, the question last) move into its history as one
    agent message, so its artifacts become this turn's alone. A client that reads the task's
    artifacts when it ends (ovos-a2a-solver-plugin and hivemind-a2a-agent-plugin without
    `streaming`, their default) then says the answer, not the question again; GetTask still
    has the whole exchange in order (the SDK appends the answer to the history next).

    In place: the a2a-sdk 1.3.0 handler gives the executor the task it goes on saving (its
    task manager's own), and ignores a Task event for a task that exists."""
    from a2a.types import Message, Part, Role
    said = [Part(text=p.text) for a in task.artifacts for p in a.parts if p.text]
    task.ClearField("artifacts")
    if said:
        task.history.append(Message(role=Role.ROLE_AGENT, message_id=uuid.uuid4().hex,
                                    task_id=task.id, context_id=task.context_id, parts=said))


class HubExecutor:
    """The agent behind the SDK's handler (its AgentExecutor's two methods; the SDK calls
    them without checking the base class): a message is a turn of its context's session."""

    def __init__(self, agent, book: TaskBook):
        from hivemind_chat_agent.bridges.hub_failures import hub_address
        self.agent, self.book, self.hub = agent, book, hub_address(agent)
        self.turns: Dict[str, Any] = {}       # task id -> its ChatTurn while it runs

    async def execute(self, context, event_queue) -> None:
        from a2a.helpers.proto_helpers import new_task_from_user_message
        from a2a.server.tasks import TaskUpdater
        from a2a.utils.errors import InvalidParamsError
        caller = caller_of(context.call_context)
        try:
            meaning = self.book.meaning(caller, context.task_id, context.context_id)
        except Refused as e:
            raise InvalidParamsError(message=str(e)) from None
        session = self.book.session_for(caller, context.context_id)
        turn = await self._begin(context.get_user_input(), session)
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        else:
            turn_over(context.current_task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        self.turns[context.task_id] = turn
        request = REQUEST_TASKS.get(None)
        if request is not None:
            request.task_ids.append(context.task_id)
            if request.gone:            # its caller hung up while the turn began
                turn.terminate()
        try:
            await updater.start_work()
            await self._speak(turn, updater, answering=meaning == ANSWER)
        finally:
            self.turns.pop(context.task_id, None)
            turn.terminate()            # a no-op once the turn has ended

    async def _begin(self, text: str, session: str):
        """The turn, begun; a hub that cannot be reached is a JSON-RPC error naming it."""
        from a2a.utils.errors import InternalError, InvalidParamsError

        from hivemind_chat_agent.bridges.hub_failures import hub_failure
        from hivemind_chat_agent.errors import HiveMindChatError
        if not text.strip():
            raise InvalidParamsError(message="the message has no text part to say to the hub")
        try:
            return await self.agent.abegin([{"role": "user", "content": text}],
                                           session_id=session)
        except HiveMindChatError as e:
            raise InternalError(message=hub_failure(e, self.hub).message) from None

    async def _speak(self, turn, updater, answering: bool) -> None:
        """Each sentence as an artifact of its own, sent as it is spoken, then the final
        state. One artifact per sentence, not appended chunks of one: the ecosystem's
        clients join an artifact's parts without a separator and artifacts with a newline
        (ovos-a2a-solver-plugin 0.0.4a1, hivemind-a2a-agent-plugin 0.1.6a1)."""
        from a2a.types import Part

        from hivemind_chat_agent.bridges.hub_failures import hub_failure
        from hivemind_chat_agent.core.outcomes import TurnStatus
        from hivemind_chat_agent.errors import HiveMindChatError
        answer = uuid.uuid4().hex[:12]
        said: List[str] = []
        try:
            async for sentence in turn:
                await updater.add_artifact([Part(text=sentence)], last_chunk=True,
                                           artifact_id=f"sentence-{answer}-{len(said) + 1}",
                                           name=f"sentence {len(said) + 1}")
                said.append(sentence)
        except HiveMindChatError as e:
            await updater.failed(self._words(updater, hub_failure(e, self.hub).message))
            return
        status = turn.status
        if status is TurnStatus.ASKED:      # the question is in the artifacts already:
            await updater.requires_input()  # a status message would be said twice
        elif status in (TurnStatus.ANSWERED, TurnStatus.NOT_UNDERSTOOD):
            await updater.complete(None if said else self._words(
                updater, "the OVOS hub had no answer for this"))
        elif status is TurnStatus.CANCELLED:
            await updater.cancel()
        else:
            error = turn.get_exception()
            words = hub_failure(error, self.hub).message if error is not None else \
                f"the OVOS hub at {self.hub} did not finish the answer ({status.value})"
            await updater.failed(self._words(updater, words))

    @staticmethod
    def _words(updater, text: str):
        from a2a.types import Part
        return updater.new_agent_message([Part(text=text)])

    def stop(self, task_id: str) -> None:
        """Stop the turn of `task_id` at the hub if it still runs (its caller is gone)."""
        turn = self.turns.pop(task_id, None)
        if turn is not None:
            turn.terminate()

    async def cancel(self, context, event_queue) -> None:
        """Stop the task's turn at the hub (the barge-in); the task ends `canceled`."""
        from a2a.server.tasks import TaskUpdater
        self.stop(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()
