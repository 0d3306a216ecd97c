"""The LLM editor and diagnoser over real HTTP: `harnessrl serve`'s app runs a scripted policy
that answers with a known patch (and known root causes), or with garbage, which is counted
and dropped, never a crash."""

import json
import random

from harnessrl.cli import main
from harnessrl.harness import Harness, HarnessLimits
from harnessrl.harness.siblings import RecoveryRule, Sibling
from harnessrl.policy.faulty import FaultyPolicy
from harnessrl.rescue.diagnose import Diagnosis, Failure
from harnessrl.rescue.llm import ChatClient, LLMDiagnoser, LLMEditor
from harnessrl.rescue.pool import Pool
from harnessrl.rescue.runs import run_grid
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import load_suite
from serve_helpers import Scripted, running

BASE = "S0-T1-O1-C0-W0"
SETTINGS = RolloutSettings(limits=HarnessLimits(max_turns=10, max_new_tokens=16_384, context_tokens=262_144),
                       backend="bwrap", env_workers=2)
KNOWN_PATCH = {
    "rationale": "surface failures and remind to submit",
    "edits": [
        {"kind": "recovery_rule", "hint": "That command failed: read the error and redo the step.",
         "rationale": "failures are ignored", "root_causes": ["error_ignored"]},
        {"kind": "hook", "at": "after_step", "text": "If the work is done, submit now.",
         "rationale": "it never submits", "root_causes": ["never_submitted"]},
    ],
}


def answer_known(context):
    prompt = context.messages[-1]["content"]
    if "You diagnose why" in prompt:
        tasks = [line.split()[2] for line in prompt.splitlines() if line.startswith("- task ")]
        return json.dumps({"failures": [{"task": t, "causes": ["error_ignored", "never_submitted"]} for t in tasks]})
    return "Here is the patch:\n```json\n" + json.dumps(KNOWN_PATCH) + "\n```"


def answer_garbage(context):
    return 'I would add a hint {"kind": "hook", "at": "sometimes"'


def diagnosis():
    failures = [Failure(f"t{i}", BASE, ["error_ignored", "never_submitted"], {"error_ignored": "x"}) for i in range(3)]
    return Diagnosis(failures=failures)


def test_llm_editor_answers_a_known_patch_over_http():
    with running(Scripted(answer_known)) as (server, policy, _):
        editor = LLMEditor(ChatClient(server.base_url, "test-model"))
        candidates = editor.propose(Sibling("H0", BASE), Harness.named(BASE), diagnosis(), 2, random.Random(0))
    assert editor.answers == 2 and editor.dropped == 0 and len(candidates) == 2
    assert candidates[0].edits[0] == RecoveryRule(hint="That command failed: read the error and redo the step.",
                                                  rationale="failures are ignored", root_causes=("error_ignored",))
    assert candidates[0].source == "llm" and set(candidates[0].targets) == {"error_ignored", "never_submitted"}
    prompt = policy.contexts[0].messages[-1]["content"]
    assert "guard_rule" in prompt and "error_ignored" in prompt and "{targets}" not in prompt
    raw = policy.contexts[0].raw
    assert raw["temperature"] == 0.6 and raw["model"] == "test-model"


def test_garbage_answers_are_counted_and_dropped_never_a_crash():
    with running(Scripted(answer_garbage)) as (server, _, _):
        editor = LLMEditor(ChatClient(server.base_url, "test-model"))
        candidates = editor.propose(Sibling("H0", BASE), Harness.named(BASE), diagnosis(), 3, random.Random(0))
        diagnoser = LLMDiagnoser(ChatClient(server.base_url, "test-model"))
        tasks = list(load_suite("workspace").tasks("train", limit=4, seed=0))
        trajectories = run_grid(FaultyPolicy(), [("H0", Harness.named(BASE, SETTINGS.limits))], tasks, SETTINGS)["H0"]
        result = diagnoser.diagnose(trajectories, {t.id: t for t in tasks})
    assert candidates == [] and editor.answers == 3 and editor.dropped == 3
    assert "no JSON object" in editor.problems[0] or "not valid" in editor.problems[0]
    assert result.dropped == 1 and diagnoser.dropped == 1 and result.failures  # offline causes kept
    unreachable = LLMEditor(ChatClient("http://127.0.0.1:9", "m", timeout_s=2))
    assert unreachable.propose(Sibling("H0", BASE), Harness.named(BASE), diagnosis(), 1, random.Random(0)) == []
    assert unreachable.dropped == 1


def test_llm_diagnoser_labels_failures_over_http():
    tasks = list(load_suite("workspace").tasks("train", limit=6, seed=0))
    trajectories = run_grid(FaultyPolicy(), [("H0", Harness.named(BASE, SETTINGS.limits))], tasks, SETTINGS)["H0"]
    with running(Scripted(answer_known)) as (server, _, _):
        result = LLMDiagnoser(ChatClient(server.base_url, "test-model")).diagnose(trajectories, {t.id: t for t in tasks})
    assert result.failures and all(f.causes == ["error_ignored", "never_submitted"] for f in result.failures)
    assert result.dropped == 0


def test_evolve_with_the_llm_editor_and_a_garbage_one(tmp_path, capsys):
    with running(Scripted(answer_known)) as (server, _, _):
        code = main(["pool", "evolve", "--base", BASE, "--policy", "faulty", "--editor", "llm", "--diagnoser", "llm",
                     "--editor-url", server.base_url, "--editor-model", "test-model", "--rounds", "1",
                     "--candidates", "1", "--limit", "10", "--validate-tasks", "8", "--max-turns", "10",
                     "--backend", "bwrap", "--workers", "2", "--out", str(tmp_path / "good")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    pool = Pool.load(tmp_path / "good")
    assert summary["rounds"][0]["valid"] == 1 and len(pool) == 2
    assert [e.to_dict()["kind"] for e in pool.members[1].patch.edits] == ["recovery_rule", "hook"]
    with running(Scripted(answer_garbage)) as (server, _, _):
        code = main(["pool", "evolve", "--base", BASE, "--policy", "faulty", "--editor", "llm",
                     "--editor-url", server.base_url, "--editor-model", "test-model", "--rounds", "2",
                     "--candidates", "2", "--limit", "6", "--max-turns", "10", "--backend", "bwrap",
                     "--out", str(tmp_path / "bad")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["members"] == 1 and summary["rounds"][0]["candidates"] == 0
