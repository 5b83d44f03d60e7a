"""core/openai_conversations: which OVOS session an OpenAI chat request continues (no I/O)."""
from hivemind_chat_agent.core.openai_conversations import (
    Continuation,
    ConversationIndex,
    content_text,
)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_a_name_wins_over_the_history_headers_first_then_user():
    index = ConversationIndex()
    by_header = index.continuation("k", {"x-openwebui-chat-id": "c1",
                                         "x-conversation-id": "other"}, "ada", [user("hi")])
    again = index.continuation("k", {"x-openwebui-chat-id": "c1"}, None,
                               [user("a"), assistant("b"), user("hi")])
    assert by_header.named and by_header.session_id == again.session_id
    by_conversation = index.continuation("k", {"x-conversation-id": "c1"}, None, [user("hi")])
    by_user = index.continuation("k", {}, "c1", [user("hi")])
    assert len({by_header.session_id, by_conversation.session_id, by_user.session_id}) == 3
    # one key never reaches another's conversations
    assert index.continuation("k2", {}, "c1", [user("hi")]).session_id != by_user.session_id


def test_a_history_continues_the_session_that_gave_its_last_answer():
    index = ConversationIndex()
    first = index.continuation("k", {}, None, [user("remember ada")])
    index.answered("k", first.session_id, [user("remember ada")], "I will remember that")
    later = index.continuation("k", {}, None, [user("remember ada"),
                                               assistant("I will remember that"),
                                               user("recall")])
    assert later == first
    # an edited history, or another key: a new session
    assert index.continuation("k", {}, None, [user("remember bob"),
                                              assistant("I will remember that"),
                                              user("recall")]).session_id != first.session_id
    assert index.continuation("k2", {}, None, [user("remember ada"),
                                               assistant("I will remember that"),
                                               user("recall")]).session_id != first.session_id


def test_two_chats_that_began_alike_never_continue_inside_either():
    index = ConversationIndex()
    a = index.continuation("k", {}, None, [user("hello")])
    b = index.continuation("k", {}, None, [user("hello")])
    assert a.session_id != b.session_id
    index.answered("k", a.session_id, [user("hello")], "hello there", {"lang": "en-US", "x": 1})
    index.answered("k", b.session_id, [user("hello")], "hello there", {"lang": "en-US", "x": 2})
    history = [user("hello"), assistant("hello there"), user("my name is ada")]
    next_a, next_b = (index.continuation("k", {}, None, history) for _ in range(2))
    assert {next_a.session_id, next_b.session_id}.isdisjoint({a.session_id, b.session_id})
    assert next_a.session_id != next_b.session_id
    assert next_a.start_from == {"lang": "en-US", "x": 1}     # the state after that answer


def test_the_index_is_bounded_and_content_parts_count_as_text():
    index = ConversationIndex(max_entries=3)
    for i in range(10):
        index.answered("k", f"s{i}", [user(f"q{i}")], "a")
    assert len(index) == 3
    assert content_text([{"type": "text", "text": "a"}, {"type": "image_url"},
                         {"type": "text", "text": "b"}]) == "ab"
    assert content_text(None) == "" and content_text("x") == "x"


def test_a_history_ending_at_an_older_answer_forks_from_the_state_saved_there():
    """Replaying a chat's opening (someone else with the same key, or a regenerated message)
    never joins the live conversation: it forks from the Session as it was at that answer."""
    index = ConversationIndex()
    opening = [user("my name is alice")]
    live = index.continuation("k", {}, None, opening)
    index.answered("k", live.session_id, opening, "nice to meet you", {"at": "opening"})
    second = opening + [assistant("nice to meet you"), user("remember tea")]
    assert index.continuation("k", {}, None, second) == live
    index.answered("k", live.session_id, second, "noted", {"at": "second"})
    replayed = index.continuation("k", {}, None, opening + [assistant("nice to meet you"),
                                                           user("what is my name")])
    assert replayed.session_id != live.session_id
    assert replayed.start_from == {"at": "opening"}
    # the live chat, sending its latest answer, still continues in place
    assert index.continuation("k", {}, None, second + [assistant("noted"),
                                                       user("recall")]) == live


def test_a_fork_starts_from_the_snapshot_of_the_answer_it_continues():
    """What the OpenAI front keeps of a session (the book's snapshot) seeds a fork of it: the
    fork's first turn sends that state, under its own id; the original goes on untouched."""
    from ovos_bus_client.session import Session

    from hivemind_chat_agent.client.session_book import SessionBook
    book = SessionBook("d")
    live, fork = "oc-live", "oc-fork"
    for sid in (live, fork):
        book.forget(sid)
    assert book.snapshot(live) is None
    told = Session(live)
    told.activate_skill("memory.skill")
    assert book.absorb(live, told.serialize())
    state = book.snapshot(live)
    assert state["session_id"] == live and state["active_skills"][0][0] == "memory.skill"
    assert book.seed(fork, state)
    assert not book.seed(fork, state)            # known already: left as it is
    assert not book.seed("oc-other", {"active_skills": "not a list"})     # no Session
    assert book.snapshot("oc-other") is None
    sent = book.wire(book.for_turn(fork))
    assert sent["session_id"] == fork and sent["active_skills"][0][0] == "memory.skill"
    assert book.snapshot(live)["session_id"] == live
    for sid in (live, fork, "oc-other"):
        book.forget(sid)


def test_a_previous_response_id_continues_its_session_or_forks_like_a_history():
    """The Responses API's previous_response_id: the latest response of a session continues
    it, an older one forks from the state saved there, an id given to another key is unknown;
    a named turn since makes every earlier response of that session older."""
    index = ConversationIndex()
    first = index.continuation("k", {}, None, [user("note tea")])
    index.answered("k", first.session_id, [user("note tea")], "noted", {"at": 1},
                   response_id="resp_1")
    assert index.after_response("k", "resp_1") == first
    assert index.after_response("k2", "resp_1") is None
    assert index.after_response("k", "resp_unknown") is None
    # the history of that answer still continues in place too (both are its latest)
    assert index.continuation("k", {}, None, [user("note tea"), assistant("noted"),
                                              user("notes")]) == first
    index.answered("k", first.session_id, None, "noted", {"at": 2}, response_id="resp_2")
    fork = index.after_response("k", "resp_1")
    assert fork.session_id != first.session_id and fork.start_from == {"at": 1}
    assert index.after_response("k", "resp_2") == first
    named = index.named("k", "conversation:c")
    assert named.named and named == index.named("k", "conversation:c")
    index.answered("k", named.session_id, None, "noted", {"at": 3}, response_id="resp_3")
    assert index.after_response("k", "resp_3") == Continuation(named.session_id)
    index.moved_on(named.session_id)
    assert index.after_response("k", "resp_3").session_id != named.session_id
