"""Harness-S rescue where verl filters groups: the rows of the rescue groups for verl's dead groups.

verl 0.9.1 filters groups in its replay buffer (``algorithm.filter_groups``, DAPO dynamic
sampling): a finished group whose metric has no spread is evicted, and the trainer's
``refill_fn(count)`` submits ``count`` fresh prompts from the data loader. That call carries a
number only: no hook receives the evicted groups or lets the caller choose the prompts to
submit, so a rescue group (the same task under K siblings of its harness) cannot be put in
their place through configuration. ``rescue_rows`` is the part that does not depend on that
hook: from the finished groups it finds the dead ones (``rescue.groups``' rule: no rollout
passed) and plans their rescue (``rescue.groups.plan_rescue``), returning dataset rows that
the agent loop runs like any other. docs/verl.md says what verl would need to call it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harnessrl.integrations.verl import AGENT_NAME
from harnessrl.rescue.groups import GroupInfo, plan_rescue
from harnessrl.rescue.router import Router, TaskInfo


def dead_group_keys(group_keys: Sequence[str], passed: Sequence[bool]) -> list[str]:
    """Returns the keys (verl's ``uid``) of groups none of whose rollouts passed, first seen first."""
    if len(group_keys) != len(passed):
        raise ValueError(f"{len(group_keys)} group keys but {len(passed)} outcomes")
    any_passed: dict[str, bool] = {}
    for key, ok in zip(group_keys, passed, strict=True):
        any_passed[key] = any_passed.get(key, False) or bool(ok)
    return [key for key, ok in any_passed.items() if not ok]


def rescue_rows(
    groups: Mapping[str, Mapping[str, Any]],
    dead: Sequence[str],
    mode: str,
    k: int,
    router: Router | None,
    siblings_of: Callable[[str], Sequence[str]],
    seed: int,
) -> list[dict[str, Any]]:
    """Returns one dataset row per rescue rollout of the ``dead`` groups. ``groups`` maps a
    group key to one of its rows (the columns ``dataset.build_rows`` writes); each rescue row
    copies it with the sibling's name as ``harness`` and says which group it rescues."""
    infos = []
    for number, key in enumerate(dead):
        row = groups[key]
        task = TaskInfo(str(row["task_id"]), instruction=str(row["prompt"][0]["content"]) if row.get("prompt") else "")
        infos.append(GroupInfo(number, task, str(row["harness"])))
    rows = []
    for run in plan_rescue(mode, infos, k, router, siblings_of, seed):
        base = groups[dead[run.group]]
        rows.append({
            **base, "agent_name": AGENT_NAME, "harness": run.harness,
            "rescues": dead[run.group], "rescue_member": run.member,
        })
    return rows
