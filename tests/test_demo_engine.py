"""The demo's AIML brain cache (bridges/aiml_brain.py) and the demo hub's kept identity
(bridges/local_hub.py): reused on the next start, learned or made again when missing, damaged
or stale, never fatal. The quick tests learn two small AIML files, not the ALICE set; the
`hub` test at the end runs the real demo three times."""
import os
import stat
import subprocess
import sys

import pytest

from hivemind_chat_agent.bridges import aiml_brain, demo_engine
from hivemind_chat_agent.bridges.local_hub import keep_identity, restore_identity

GREETING = """<?xml version="1.0" encoding="UTF-8"?>
<aiml version="1.0.1">
<category><pattern>HELLO</pattern><template>{answer}</template></category>
</aiml>
"""


def aiml_file(folder, answer, name="greeting.aiml"):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(GREETING.format(answer=answer))
    return path


@pytest.fixture
def sources(tmp_path):
    return [aiml_file(str(tmp_path), "Hello from the files."), demo_engine.MEMORY_AIML]


def brain_files(cache_dir):
    return sorted(n for n in os.listdir(cache_dir) if n.startswith("aiml-brain-"))


def test_a_brain_survives_encoding_and_anything_else_is_refused():
    brain = aiml_brain.Brain(2, "Nameless", {"HELLO": {2: ["template", {}, "hi"]}})
    data = aiml_brain.encode("k" * 64, brain)
    assert aiml_brain.decode(data, "k" * 64) == brain
    assert aiml_brain.decode(data, "j" * 64) is None                # another key
    assert aiml_brain.decode(data[:-1], "k" * 64) is None           # cut short
    assert aiml_brain.decode(data[:20], "k" * 64) is None           # cut inside the header
    flipped = bytearray(data)
    flipped[-3] ^= 0x01
    assert aiml_brain.decode(bytes(flipped), "k" * 64) is None      # one bit off
    assert aiml_brain.decode(b"", "k" * 64) is None


def test_the_second_start_reads_the_brain_the_first_wrote(tmp_path, sources):
    cache = str(tmp_path / "cache")
    first = demo_engine.learned_kernel(sources, cache)
    assert first.respond("hello", "s") == "Hello from the files."
    [name] = brain_files(cache)
    key = aiml_brain.brain_key(sources, demo_engine.new_kernel().version())
    assert name == os.path.basename(aiml_brain.brain_path(cache, key))
    # the same key holding another brain: a start that answers from it did not learn
    other = demo_engine.learn(demo_engine.new_kernel(),
                               [aiml_file(str(tmp_path), "Hello from the cache.", "b.aiml")])
    aiml_brain.write(aiml_brain.brain_path(cache, key), key, aiml_brain.take(other))
    second = demo_engine.learned_kernel(sources, cache)
    assert second.respond("hello", "s") == "Hello from the cache."


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_brain_is_learned_again_and_rewritten(tmp_path, sources, damage):
    cache = str(tmp_path / "cache")
    demo_engine.learned_kernel(sources, cache)
    path = os.path.join(cache, brain_files(cache)[0])
    with open(path, "rb") as f:
        data = f.read()
    damaged = {"truncate": data[:len(data) // 2], "empty": b"",
               "flip": data[:-5] + bytes([data[-5] ^ 0x40]) + data[-4:],
               "garbage": os.urandom(len(data))}[damage]
    with open(path, "wb") as f:
        f.write(damaged)
    kernel = demo_engine.learned_kernel(sources, cache)
    assert kernel.respond("hello", "s") == "Hello from the files."
    key = aiml_brain.brain_key(sources, demo_engine.new_kernel().version())
    assert aiml_brain.read(path, key) is not None                   # rewritten whole
    assert brain_files(cache) == [os.path.basename(path)]
    assert not [n for n in os.listdir(cache) if n.endswith(".tmp")]


def test_changed_files_make_another_key_and_are_learned(tmp_path, sources):
    cache = str(tmp_path / "cache")
    demo_engine.learned_kernel(sources, cache)
    old_key = aiml_brain.brain_key(sources, demo_engine.new_kernel().version())
    aiml_file(str(tmp_path), "Hello, changed.")                     # same name, new content
    new_key = aiml_brain.brain_key(sources, demo_engine.new_kernel().version())
    assert new_key != old_key
    kernel = demo_engine.learned_kernel(sources, cache)
    assert kernel.respond("hello", "s") == "Hello, changed."
    assert len(brain_files(cache)) == 2
    assert aiml_brain.read(aiml_brain.brain_path(cache, new_key), new_key) is not None


def test_only_the_most_recently_used_brains_are_kept(tmp_path, sources):
    # brains of keys no install uses any more (12 MB each) are deleted at the next write; the
    # most recently used stay, so installs sharing the folder do not learn in turn
    cache = str(tmp_path / "cache")
    brain = aiml_brain.Brain(1, "Nameless", {"HELLO": {1: ["template", {}, "hi"]}})
    for n in range(aiml_brain.KEPT_BRAINS):
        key = f"{n}" * 64
        path = aiml_brain.brain_path(cache, key)
        aiml_brain.write(path, key, brain)
        os.utime(path, (1000 + n, 1000 + n))        # written in this order, long ago
    assert aiml_brain.read(aiml_brain.brain_path(cache, "0" * 64), "0" * 64) == brain  # used
    demo_engine.learned_kernel(sources, cache)      # a new key: written, one too many
    kept = brain_files(cache)
    assert len(kept) == aiml_brain.KEPT_BRAINS
    assert os.path.basename(aiml_brain.brain_path(cache, "1" * 64)) not in kept   # least used
    assert os.path.basename(aiml_brain.brain_path(cache, "0" * 64)) in kept       # read lately
    key = aiml_brain.brain_key(sources, demo_engine.new_kernel().version())
    assert os.path.basename(aiml_brain.brain_path(cache, key)) in kept            # the new one


def test_the_key_names_aiml_and_python_versions(sources, monkeypatch):
    key = aiml_brain.brain_key(sources, "python-aiml 0.9.2")
    assert aiml_brain.brain_key(sources, "python-aiml 0.9.3") != key
    monkeypatch.setattr(aiml_brain.marshal, "version", aiml_brain.marshal.version + 1)
    assert aiml_brain.brain_key(sources, "python-aiml 0.9.2") != key


def test_a_cache_that_cannot_be_written_costs_only_time(tmp_path, sources):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    kernel = demo_engine.learned_kernel(sources, str(blocker / "cache"))
    assert kernel.respond("hello", "s") == "Hello from the files."


def test_no_cache_learns_and_writes_nothing(tmp_path, sources):
    engine_kernel = demo_engine.learned_kernel(sources, None)
    assert engine_kernel.respond("hello", "s") == "Hello from the files."
    assert os.listdir(tmp_path) == ["greeting.aiml"]


# ---- the demo hub's identity, kept between starts ----

PEM = b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"


def make_identity(folder, pem=PEM):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "_identity.json"), "w") as f:
        f.write('{"secret_key": "HiveMindComs.pem", "public_key": "PUBLIC"}')
    with open(os.path.join(folder, "HiveMindComs.pem"), "wb") as f:
        f.write(pem)


def test_an_identity_kept_is_restored_whole_and_private(tmp_path):
    made, kept, fresh = (str(tmp_path / n) for n in ("made", "kept", "fresh"))
    make_identity(made)
    keep_identity(made, kept)
    assert restore_identity(kept, fresh)
    for name in ("_identity.json", "HiveMindComs.pem"):
        with open(os.path.join(made, name), "rb") as a, open(os.path.join(fresh, name), "rb") as b:
            assert a.read() == b.read()
        assert stat.S_IMODE(os.stat(os.path.join(fresh, name)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o700


def test_an_identity_already_kept_is_left_as_it_is(tmp_path):
    first, second, kept = (str(tmp_path / n) for n in ("first", "second", "kept"))
    make_identity(first)
    make_identity(second, pem=b"-----BEGIN-----\nBBBB\n-----END-----\n")
    keep_identity(first, kept)
    keep_identity(second, kept)               # a hub started at the same moment
    with open(os.path.join(kept, "HiveMindComs.pem"), "rb") as f:
        assert b"AAAA" in f.read()
    assert sorted(os.listdir(tmp_path)) == ["first", "kept", "second"]   # no scratch left


@pytest.mark.parametrize("damage", ["no-pem", "short-pem", "bad-json", "no-folder"])
def test_a_damaged_kept_identity_is_not_restored_and_is_replaced(tmp_path, damage):
    kept, fresh, made = (str(tmp_path / n) for n in ("kept", "fresh", "made"))
    if damage != "no-folder":
        make_identity(kept)
    if damage == "no-pem":
        os.unlink(os.path.join(kept, "HiveMindComs.pem"))
    elif damage == "short-pem":
        with open(os.path.join(kept, "HiveMindComs.pem"), "wb") as f:
            f.write(b"-----BEGIN RSA PRIVATE KEY-----\nAA")
    elif damage == "bad-json":
        with open(os.path.join(kept, "_identity.json"), "w") as f:
            f.write('{"secret_key": "HiveMind')
    assert not restore_identity(kept, fresh)
    assert not os.path.exists(fresh)
    make_identity(made, pem=b"-----BEGIN-----\nNEW\n-----END-----\n")
    keep_identity(made, kept)
    assert restore_identity(kept, fresh)
    with open(os.path.join(fresh, "HiveMindComs.pem"), "rb") as f:
        assert b"NEW" in f.read()


# ---- the real demo, three starts on one cache folder ----

def run_demo(cache, utterance="my name is Ada"):
    cli = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    done = subprocess.run([cli, "demo", utterance], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def file_ids(folder):
    stats = {n: os.stat(os.path.join(folder, n)) for n in os.listdir(folder)
             if not n.startswith(".")}
    return {n: (s.st_ino, s.st_mtime_ns) for n, s in stats.items()}


@pytest.mark.hub     # the demo starts an embedded hub
def test_the_demo_reuses_its_cache_and_relearns_a_damaged_one(tmp_path):
    cache = str(tmp_path)
    assert "Ada" in run_demo(cache)
    ours = os.path.join(cache, "hivemind-chat-agent")
    [brain] = brain_files(ours)
    kept = file_ids(ours)
    hub_identity = file_ids(os.path.join(ours, "demo-hub"))
    assert "Ada" in run_demo(cache)
    # read, not written again: the same files (a write renames a new one in); the brain's
    # modification time is its last use (aiml_brain.read marks it, for pruning)
    assert {n: ino for n, (ino, _) in file_ids(ours).items()} == \
        {n: ino for n, (ino, _) in kept.items()}
    assert file_ids(os.path.join(ours, "demo-hub")) == hub_identity
    with open(os.path.join(ours, brain), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(ours, brain)) // 3)
    assert "Ada" in run_demo(cache)
    assert brain_files(ours) == [brain]
    assert os.path.getsize(os.path.join(ours, brain)) > 1_000_000   # whole again
    assert file_ids(ours)[brain][0] != kept[brain][0]     # a new file, renamed in
