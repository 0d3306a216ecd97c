"""Checkpoints survive being killed anywhere in the save path: SIGKILL at seeded random
moments of a process that saves (and restates) in a loop, a simulated death at every file
operation of a save and of a restate, and a real `harnessrl train` killed during its final
evaluation; every time the run resumes from its last complete checkpoint, on the same schedule."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from checkpoint_helpers import (  # noqa: E402
    check_loadable,
    kill_train_when,
    restate_step,
    save_forever,
    save_step,
    small_model,
    train_command,
    train_env,
    training_objects,
    write_run_config,
)
from harnessrl.rl.checkpoint import latest_checkpoint, recover_checkpoints  # noqa: E402


def stranded(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".")) if root.exists() else []


def test_sigkill_at_random_moments_always_leaves_the_last_complete_checkpoint(tmp_path):
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers", "checkpoint_helpers"])
    rng = random.Random(16)
    run_dir = tmp_path / "run"
    save_seconds = 0.05  # refined from the acknowledgements as the test goes
    seen_stranded = 0
    acknowledged: tuple[int, bool] = (0, True)
    for attempt in range(12):
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=save_forever, args=(str(run_dir), sender), daemon=True)
        child.start()
        sender.close()
        assert receiver.poll(120), "the saving process did not start"
        kind, resumed_step = receiver.recv()
        assert kind == "ready" and resumed_step == acknowledged[0], (attempt, resumed_step, acknowledged)
        # Kill in the first save of a step or in its re-save, at a random point of it.
        phase_resaved = rng.random() < 0.5
        fraction = rng.random() * 1.3
        started = time.monotonic()
        while True:
            assert receiver.poll(120), "no save finished"
            _, step, resaved = receiver.recv()
            now = time.monotonic()
            save_seconds = 0.8 * save_seconds + 0.2 * (now - started)
            started = now
            acknowledged = (step, resaved)
            if resaved != phase_resaved:  # the next save is the phase to hit
                break
        time.sleep(fraction * save_seconds)
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        try:
            while receiver.poll():  # saves that returned before the kill landed
                _, step, resaved = receiver.recv()
                acknowledged = (step, resaved)
        except EOFError:  # the child's end of the pipe closed with it
            pass
        receiver.close()

        seen_stranded += bool(stranded(run_dir))
        messages = recover_checkpoints(run_dir)
        assert all(str(run_dir) in m or "step-" in m for m in messages)
        assert stranded(run_dir) == []  # recovered or removed
        latest = latest_checkpoint(run_dir)
        assert latest is not None, (attempt, acknowledged)
        state = check_loadable(latest)
        # Never older than the last save that returned; a later one only if it is complete.
        assert (state["step"], state["resaved"]) >= acknowledged, (attempt, state, acknowledged)
        acknowledged = (state["step"], state["resaved"])
    assert seen_stranded >= 4  # the kills did land inside saves


class SimulatedDeath(BaseException):
    """The process dying at one operation: nothing after it runs (no except clause catches it)."""


FILE_OPERATIONS = [(os, "replace"), (os, "rename"), (os, "unlink"), (os, "rmdir"), (os, "mkdir"), (os, "fsync"),
                   (os, "link"), (torch, "save"), (shutil, "rmtree")]


def test_a_death_at_every_file_operation_of_a_save_leaves_a_complete_checkpoint(tmp_path, monkeypatch):
    model = small_model()
    optimizer, scheduler = training_objects(model)
    template = tmp_path / "template"
    save_step(template, 1, model, optimizer, scheduler, resaved=True)
    originals = {(module, name): getattr(module, name) for module, name in FILE_OPERATIONS}
    operations = [0]
    die_at = [0]

    def counting(module, name):
        original = originals[(module, name)]

        def call(*args, **kwargs):
            operations[0] += 1
            if operations[0] == die_at[0]:
                raise SimulatedDeath(f"{name} #{operations[0]}")
            return original(*args, **kwargs)

        return call

    deaths = 0
    for point in range(1, 400):
        run_dir = tmp_path / f"run-{point}"
        shutil.copytree(template, run_dir)
        operations[0], die_at[0] = 0, point
        completed: tuple[int, bool] = (1, True)
        with monkeypatch.context() as patch:
            for module, name in FILE_OPERATIONS:
                patch.setattr(module, name, counting(module, name))
            try:
                # A new step, its trainer state restated (the final evaluation's record), and the
                # next step (pruning step 1).
                save_step(run_dir, 2, model, optimizer, scheduler, resaved=False)
                completed = (2, False)
                restate_step(run_dir, 2)
                completed = (2, True)
                save_step(run_dir, 3, model, optimizer, scheduler, resaved=False)
                completed = (3, False)
            except SimulatedDeath:
                deaths += 1
            else:
                break  # the point lies past the last operation: every point was tried
        recover_checkpoints(run_dir)
        assert stranded(run_dir) == []
        latest = latest_checkpoint(run_dir)
        assert latest is not None, point
        state = check_loadable(latest)
        assert (state["step"], state["resaved"]) >= completed, (point, state, completed)
        shutil.rmtree(run_dir)
    assert deaths > 10


def test_latest_checkpoint_needs_the_weights_and_reports_stranded_copies(tmp_path):
    model = small_model()
    optimizer, scheduler = training_objects(model)
    run_dir = tmp_path / "run"
    save_step(run_dir, 1, model, optimizer, scheduler, resaved=True)
    save_step(run_dir, 2, model, optimizer, scheduler, resaved=True)
    root = run_dir / "checkpoints"
    (root / "step-000002" / "model" / "model.safetensors").unlink()  # what the old re-save could leave
    assert latest_checkpoint(run_dir) == root / "step-000001"
    # A complete copy stranded in a temporary folder is the newest checkpoint, and resume recovers it.
    shutil.rmtree(root / "step-000002")
    save_step(tmp_path / "other", 2, model, optimizer, scheduler, resaved=True)
    shutil.copytree(tmp_path / "other" / "checkpoints" / "step-000002", root / ".tmp-step-000002")
    shutil.copytree(root / "step-000001", root / ".tmp-step-000003")
    (root / ".tmp-step-000003" / "trainer_state.json").unlink()  # an incomplete one
    assert latest_checkpoint(run_dir) == root / ".tmp-step-000002"
    messages = recover_checkpoints(run_dir)
    assert any("recovered" in m and "step-000002" in m for m in messages), messages
    assert any("removed" in m and ".tmp-step-000003" in m for m in messages), messages
    assert latest_checkpoint(run_dir) == root / "step-000002" and stranded(run_dir) == []
    assert check_loadable(root / "step-000002")["step"] == 2


def test_train_killed_during_its_final_evaluation_resumes_on_the_same_schedule(tiny_model, tmp_path):
    from test_train_loop import tiny_overrides

    run_dir = tmp_path / "killed"
    config_file = write_run_config(tmp_path / "run.yaml", tiny_overrides(tiny_model, run_dir, 2))
    env = train_env(OMP_NUM_THREADS="1")
    root = run_dir / "checkpoints"
    # The last step is saved, then the final evaluation runs (without the optimizer) and its
    # record is written into that checkpoint's trainer state: kill before the record exists.
    kill_train_when(config_file, run_dir, lambda: (root / "step-000002" / "manifest.json").exists()
                    and not (run_dir / "eval" / "final.jsonl").exists(), env=env, poll_s=0.002, deadline_s=900)
    killed = json.loads((root / "step-000002" / "trainer_state.json").read_text())
    assert "final_eval" not in killed
    before = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [0, 1]
    first_sitting = json.loads((root / "step-000002" / "trainer_state.json").read_text())["wall_time_s"]
    assert first_sitting > 0
    resumed = subprocess.run([*train_command(config_file, run_dir), "--resume"], env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert after == before  # nothing redone, nothing lost: the schedule goes on where it was
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    state = json.loads((root / "step-000002" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["final_eval_step"] == 2
    assert state["wall_time_s"] > first_sitting  # the wall time of both sittings, not the last one's
    assert stranded(run_dir) == []
