"""Sibling harnesses as data: patch schema and YAML round trip, content hash, clear errors for
malformed patch files, each edit kind changing exactly what it promises, guard rules that
block and say why, golden renders of three siblings, and trajectories that name the sibling."""

import os
from pathlib import Path

import pytest

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.harness.base import SPAN_POLICY, SPAN_REMINDER, PromptContext
from harnessrl.harness.chat import ByteTokenizer
from harnessrl.harness.siblings import (
    Edit,
    GuardRule,
    Hook,
    Limits,
    Patch,
    PatchError,
    RecoveryRule,
    SetLevel,
    Sibling,
    Skill,
    SystemAddendum,
    ToolHint,
    build,
    edit_kinds,
    load_sibling,
    register_edit,
    save_sibling,
    sibling_file,
)
from harnessrl.harness.siblings.components import BLOCKED_PREFIX
from harnessrl.policy.base import Policy
from harnessrl.policy.scripted import OraclePolicy, _generation
from harnessrl.rollout.episode import Episode, run_episode
from harnessrl.sandbox import open_sandbox
from harnessrl.tasks import Action, FileEquals, Task
from harnessrl.tasks.model import TaskSetup
from harnessrl.tasks.suite import load_suite

GOLDEN = Path(__file__).parent / "golden" / "siblings"
BYTE_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)
BACKEND = "bwrap"


def hello_task():
    return Task(
        id="golden-task",
        instruction="Create a file named hello.txt containing the word hello.",
        verifier=FileEquals("hello.txt", "hello"),
        gold=[Action.write("hello.txt", "hello\n"), Action.submit("")],
        setup=TaskSetup(files={"notes.txt": "draft\n"}),
    )


class ActionScript(Policy):
    """Performs a fixed list of abstract actions in the episode's own syntax (last one repeats)."""

    name = "script"

    def __init__(self, actions):
        self.tokenizer = ByteTokenizer()
        self.actions, self.position = list(actions), 0

    def generate(self, requests):
        out = []
        for request in requests:
            action = self.actions[min(self.position, len(self.actions) - 1)]
            self.position += 1
            text = request.context.harness.tools.render(action, thought="next step")
            out.append(_generation(self.tokenizer, text, request.params.max_new_tokens))
        return out


def every_kind_patch():
    return Patch((
        SetLevel(factor="O", level=1, rationale="return codes", root_causes=("error_ignored",)),
        SystemAddendum(text="Check every result.", position="after_section", section="LIMITS"),
        ToolHint(tool="bash", text="Quote paths with spaces.", root_causes=("bad_arguments",)),
        Skill(name="inspect first", steps=("list the files", "read the inputs")),
        GuardRule(effect="block", message="Deleting files is not allowed.", pattern=r"\brm\b"),
        RecoveryRule(hint="That failed: read the error.", exit_code=1, pattern="No such file"),
        Hook(at="start", command="ls -1"),
        Limits(max_turns=12, output_chars=500),
    ), rationale="everything at once")


# ---- schema, YAML, hash -------------------------------------------------------------------

def test_every_builtin_kind_is_registered():
    assert {"set_level", "system_addendum", "tool_hint", "skill", "guard_rule", "recovery_rule", "hook",
            "limits"} <= set(edit_kinds())


def test_sibling_round_trips_through_yaml_files(tmp_path):
    sibling = Sibling("r1-01", "S1-T1-O0-C0-W0", every_kind_patch(), parent="H0", round=1)
    path = save_sibling(sibling, sibling_file(tmp_path, sibling.id))
    again = load_sibling(path)
    assert again == sibling and again.content_hash == sibling.content_hash
    assert again.to_yaml() == sibling.to_yaml()
    assert again.root_causes == ("error_ignored", "bad_arguments")


def test_content_hash_covers_behaviour_not_rationale_or_lineage():
    a = Sibling("a", "S0-T0-O0-C0-W0", Patch((ToolHint(tool="bash", text="x", rationale="one"),)))
    same = Sibling("b", "S0-T0-O0-C0-W0", Patch((ToolHint(tool="bash", text="x", rationale="two"),), "why"), parent="a")
    other_text = Sibling("a", "S0-T0-O0-C0-W0", Patch((ToolHint(tool="bash", text="y"),)))
    other_base = Sibling("a", "S1-T0-O0-C0-W0", a.patch)
    assert a.content_hash == same.content_hash
    assert len({a.content_hash, other_text.content_hash, other_base.content_hash}) == 3


@pytest.mark.parametrize("text, expected", [
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: tool_hnt\n    tool: bash\n",
     ["edit 1", "field 'kind'", "unknown edit kind 'tool_hnt'", "did you mean 'tool_hint'"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: skill\n    name: a\n    steps: [s]\n"
     "  - kind: guard_rule\n    effect: stop\n    message: m\n    tool: bash\n",
     ["edit 2 (guard_rule)", "field 'effect'", "must be one of block, hint", "Fix: set `effect: block`"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: hook\n    at: start\n    comand: ls\n",
     ["edit 1 (hook)", "field 'comand'", "did you mean 'command'"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: tool_hint\n    text: t\n",
     ["edit 1 (tool_hint)", "field 'tool'", "is required", "Fix: add `tool:"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: hook\n    at: start\n    command: rm -rf data\n",
     ["edit 1 (hook)", "field 'command'", "not read-only", "Fix:"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: guard_rule\n    effect: block\n    message: m\n",
     ["edit 1 (guard_rule)", "would match every call", "Fix: give at least one of"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: recovery_rule\n    hint: h\n    pattern: '(['\n",
     ["edit 1 (recovery_rule)", "field 'pattern'", "not a valid regular expression"]),
    ("id: x\nbase: S0-T0-O0-C0-W0\npatch:\n  edits:\n  - kind: set_level\n    factor: T\n    level: 7\n",
     ["edit 1 (set_level)", "field 'level'", "Fix: use 0..2"]),
    ("id: x\nbase: [oops\n", ["line", "not valid YAML", "Fix:"]),
])
def test_malformed_patch_file_names_file_edit_field_and_fix(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PatchError) as info:
        load_sibling(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    for part in expected:
        assert part in message, (part, message)


def test_patch_that_does_not_apply_to_its_base_is_an_error_at_build():
    no_tool = Sibling("x", "S0-T2-O0-C0-W0", Patch((ToolHint(tool="bash", text="t"),)))
    with pytest.raises(PatchError, match=r"does not offer.*Bash"):
        build(no_tool)
    no_section = Sibling("y", "S1-T0-O0-C0-W0", Patch((SystemAddendum(text="t", position="after_section", section="Nope"),)))
    with pytest.raises(PatchError, match=r"not a section.*INTERFACE MANUAL"):
        build(no_section)


# ---- each kind changes exactly what it promises ----------------------------------------------

def opening(harness):
    ctx = PromptContext(hello_task(), harness.tools, harness.workflow, harness.limits.max_turns)
    return harness.system.system_message(ctx), harness.system.first_user_message(ctx), harness.tools.usage()


def test_prompt_edits_change_only_their_own_message():
    base = Harness.named("S1-T1-O0-C0-W0")
    b_system, b_user, b_usage = opening(base)
    add = build(Sibling("a", base.code, Patch((SystemAddendum(text="ADDED LINE", position="after_section", section="LIMITS"),))))
    system, user, usage = opening(add)
    assert user == b_user and usage == b_usage
    assert system.replace("\n\nADDED LINE", "") == b_system and system.index("ADDED LINE") > system.index("# LIMITS")
    mid = build(Sibling("m", base.code, Patch((SystemAddendum(text="MID", position="after_section", section="WORKED EXAMPLE"),))))
    system = opening(mid)[0]
    assert system.index("# WORKED EXAMPLE") < system.index("MID") < system.index("# LIMITS")
    skill = build(Sibling("s", base.code, Patch((Skill(name="check inputs", steps=("ls", "head the csv")),))))
    system, user, usage = opening(skill)
    assert system == b_system and usage == b_usage
    assert user.startswith(b_user.rstrip("\n")) and "### check inputs\n1. ls\n2. head the csv" in user
    hint = build(Sibling("h", base.code, Patch((ToolHint(tool="str_replace_editor", text="View a file before editing it."),))))
    system, user, usage = opening(hint)
    assert user == b_user and usage.startswith(b_usage) and "`str_replace_editor`: View a file before editing it." in usage
    assert system != b_system  # the system message documents the tools: the note shows there
    spec = next(s for s in hint.tools.specs() if s.name == "str_replace_editor")
    assert spec.description.endswith("Note: View a file before editing it.")


def test_set_level_is_the_neighbour_configuration():
    sibling = Sibling("n", "S0-T0-O0-C0-W0", Patch((SetLevel(factor="T", level=2), SetLevel(factor="W", level=1))))
    harness = build(sibling)
    neighbour = Harness.named("S0-T2-O0-C0-W1")
    assert harness.tools.name == neighbour.tools.name and harness.workflow.name == neighbour.workflow.name
    assert opening(harness) == opening(neighbour)


def test_limits_stay_inside_the_run_ceilings_and_cut_long_output():
    run = HarnessLimits(max_turns=10, max_new_tokens=300)
    harness = build(Sibling("l", "S0-T0-O0-C0-W0", Patch((Limits(max_turns=40, max_new_tokens=1000, output_chars=300),))), run)
    assert harness.limits.max_turns == 20 and harness.limits.max_new_tokens == 300
    policy = ActionScript([Action.run("seq 1 2000"), Action.submit("")])
    trajectory = run_episode(harness, hello_task(), policy, backend=BACKEND)
    shown = trajectory.turns[0].observation
    assert "characters elided" in shown and len(shown) < 400 and shown.startswith("1\n2\n")


# ---- flow: guards, recovery, hooks ---------------------------------------------------------

def test_guard_rule_blocks_and_says_why_and_the_action_never_runs():
    sibling = Sibling("g", "S0-T1-O1-C0-W0", Patch((
        GuardRule(effect="block", message="Deleting files is not allowed; overwrite them instead.", pattern=r"\brm\b"),
    )))
    harness = build(sibling, BYTE_LIMITS)
    policy = ActionScript([Action.run("rm notes.txt"), Action.write("hello.txt", "hello\n"), Action.run("cat notes.txt"),
                           Action.submit("")])
    with open_sandbox(backend=BACKEND) as sandbox:
        episode = Episode(harness, hello_task(), sandbox, policy.tokenizer)
        episode.start()
        while not episode.done:
            episode.advance(policy.generate([episode.request()])[0])
        trajectory = episode.finish(policy.name)
        assert sandbox.read_file("notes.txt") == "draft\n"  # the blocked rm never ran
    first = trajectory.turns[0]
    assert f"{BLOCKED_PREFIX} Deleting files is not allowed; overwrite them instead." in first.observation
    assert first.outcomes[0]["blocked"] and "<returncode>1</returncode>" in first.observation
    assert "draft" in trajectory.turns[2].observation  # later calls that do not match run
    assert trajectory.passed and trajectory.metrics["blocked_calls"] == 1


def test_guard_rule_on_repeats_and_on_an_early_submit():
    repeat = build(Sibling("r", "S0-T0-O0-C0-W0", Patch((
        GuardRule(effect="block", message="You ran this twice already; try something else.", repeats=3),
        GuardRule(effect="hint", message="Look at the output before running more.", tool="bash"),
    ))), BYTE_LIMITS)
    policy = ActionScript([Action.run("ls"), Action.run("ls"), Action.run("ls"), Action.submit("")])
    trajectory = run_episode(repeat, hello_task(), policy, backend=BACKEND)
    observations = [t.observation for t in trajectory.turns]
    assert BLOCKED_PREFIX not in observations[0] + observations[1]
    assert "You ran this twice already" in observations[2]
    assert all("Look at the output before running more." in o for o in observations[:3])
    early = build(Sibling("e", "S0-T1-O0-C0-W0", Patch((
        GuardRule(effect="block", message="Do the task before submitting.", before_change=True),
    ))), BYTE_LIMITS)
    policy = ActionScript([Action.submit(""), Action.write("hello.txt", "hello\n"), Action.submit("")])
    trajectory = run_episode(early, hello_task(), policy, backend=BACKEND)
    assert "Do the task before submitting." in trajectory.turns[0].observation
    assert trajectory.passed and trajectory.metrics["submits"] == 1 and len(trajectory.turns) == 3


def test_recovery_rule_fires_only_on_matching_failures_and_hooks_run_at_their_points():
    sibling = Sibling("f", "S0-T0-O1-C0-W0", Patch((
        RecoveryRule(hint="The file is missing: list the workspace first.", pattern="No such file"),
        Hook(at="after_step", text="Step reminder.", every=2),
        Hook(at="before_submit", text="Checklist: is hello.txt there?", command="ls -1"),
        Hook(at="start", command="ls -1", text="The workspace at the start:"),
    )))
    harness = build(sibling, BYTE_LIMITS)
    policy = ActionScript([Action.run("cat missing.txt"), Action.run("false"), Action.write("hello.txt", "hello\n"),
                           Action.submit("")])
    trajectory = run_episode(harness, hello_task(), policy, backend=BACKEND)
    observations = [t.observation for t in trajectory.turns]
    assert "The file is missing" in observations[0] and "The file is missing" not in observations[1]
    assert [("Step reminder." in o) for o in observations[:3]] == [False, True, False]
    assert "Checklist: is hello.txt there?\n$ ls -1\n(exit code 0)\nhello.txt\nnotes.txt" in observations[3]
    assert trajectory.passed and trajectory.metrics["submits"] == 2
    first_prompt = ByteTokenizer().decode(trajectory.turns[0].prompt_ids)
    assert "The workspace at the start:\n$ ls -1\n(exit code 0)\nnotes.txt" in first_prompt


def test_injected_text_is_a_harness_span_and_never_trained():
    sibling = Sibling("s", "S0-T0-O0-C0-W0", Patch((Hook(at="start", command="ls -1"),
                                                     RecoveryRule(hint="RECOVERY-HINT"))))
    trajectory = run_episode(build(sibling, BYTE_LIMITS), hello_task(),
                             ActionScript([Action.run("false"), Action.write("hello.txt", "hello\n"), Action.submit("")]),
                             backend=BACKEND)
    tokenizer = ByteTokenizer()
    last = trajectory.turns[-1]
    labels = last.prompt_labels()
    reminder_text = tokenizer.decode([i for i, s in zip(last.prompt_ids, labels, strict=True) if s == SPAN_REMINDER])
    assert "$ ls -1" in reminder_text and "RECOVERY-HINT" in reminder_text
    for sample in trajectory.training_samples():
        trained = {s for s, m in zip(sample.spans, sample.loss_mask, strict=True) if m}
        assert trained == {SPAN_POLICY}
    shown = trajectory.transcript(tokenizer)
    assert "RECOVERY-HINT" in shown and "$ ls -1" in shown and f"sibling s (hash {sibling.content_hash})" in shown


# ---- oracle, named members, user kinds ------------------------------------------------------

def test_oracle_passes_under_siblings_and_trajectories_name_sibling_and_hash(tmp_path):
    tasks = list(load_suite("workspace").tasks("test", limit=4, seed=5))
    sibling = Sibling("all", "S1-T1-O0-C0-W0", every_kind_patch())
    save_sibling(sibling, sibling_file(tmp_path, sibling.id))
    name = f"{tmp_path}#all"
    harness = Harness.named(name, BYTE_LIMITS)
    assert harness.code == name and harness.observation.level == 1  # the set_level O1
    for task in tasks:
        trajectory = run_episode(harness, task, OraclePolicy(), backend=BACKEND)
        assert trajectory.passed, (task.id, trajectory.status, trajectory.verdict)
        assert trajectory.config == name and trajectory.sibling == sibling.identity()
    with pytest.raises(ValueError, match="no sibling 'nope'; members: all"):
        Harness.named(f"{tmp_path}#nope")


def test_users_can_register_an_edit_kind():
    from dataclasses import dataclass

    @register_edit
    @dataclass(frozen=True, kw_only=True)
    class Signature(Edit):
        kind = "test_signature"
        text: str

        def apply(self, parts):
            parts.finishers.append(lambda harness: setattr(harness, "signature", self.text))

    patch = Patch.from_dict({"edits": [{"kind": "test_signature", "text": "hi"}]})
    assert build(Sibling("u", "S0-T0-O0-C0-W0", patch)).signature == "hi"


# ---- golden renders of three siblings -------------------------------------------------------

GOLDEN_SIBLINGS = {
    "prompt": (Sibling("prompt", "S1-T1-O1-C0-W0", Patch((
        SystemAddendum(text="Never edit files outside the workspace.", position="after_section", section="RESPONSE FORMAT (STRICT)"),
        ToolHint(tool="bash", text="Run one command per call; join steps with &&."),
        Skill(name="verify the output file", steps=("write the file", "cat it", "compare with the task"))))),
        [Action.write("hello.txt", "hello\n"), Action.submit("")]),
    "flow": (Sibling("flow", "S0-T0-O1-C0-W0", Patch((
        Hook(at="start", command="ls -1", text="Files in the workspace:"),
        RecoveryRule(hint="The command failed: read the error before the next step.", exit_code=1),
        Hook(at="before_submit", text="Before you finish: is hello.txt written?", command="cat hello.txt"),
        Hook(at="after_step", text="Keep to one action per response.", every=2)))),
        [Action.run("cat missing.txt"), Action.write("hello.txt", "hello\n"), Action.submit("")]),
    "guard": (Sibling("guard", "S2-T2-O1-C1-W0", Patch((
        SetLevel(factor="W", level=2),
        GuardRule(effect="block", message="Do not delete files.", pattern=r"\brm\b"),
        GuardRule(effect="hint", message="Check the file you wrote.", tool="Write"),
        Limits(output_chars=200)))),
        [Action.run("rm notes.txt"), Action.run("seq 1 500"), Action.write("hello.txt", "hello\n"), Action.submit(""),
         Action.submit("")]),
}


@pytest.mark.parametrize("key", sorted(GOLDEN_SIBLINGS))
def test_sibling_renders_match_golden(key):
    sibling, actions = GOLDEN_SIBLINGS[key]
    harness = build(sibling, BYTE_LIMITS)
    trajectory = run_episode(harness, hello_task(), ActionScript(actions), backend=BACKEND)
    assert trajectory.passed, trajectory.transcript()
    text = sibling.to_yaml() + "\n" + trajectory.transcript(ByteTokenizer(), show_spans=True) + "\n"
    path = GOLDEN / f"{key}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"golden file {path.name} is missing; run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8"), f"render of sibling {key} changed; UPDATE_GOLDEN=1 to accept"
