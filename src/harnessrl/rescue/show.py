"""What `harnessrl pool show` prints: the members, their edits, and the coverage table of their
validation records (solved, fixed and broken against the parent and H0, union coverage)."""

from __future__ import annotations

from typing import Any

from harnessrl.harness.siblings import Edit
from harnessrl.rescue.pool import Pool

_SUMMARY_FIELDS = ("factor", "level", "tool", "at", "effect", "pattern", "repeats", "name", "section", "command")


def describe_edit(edit: Edit) -> str:
    """Returns one line naming an edit's kind, its key fields and the start of its text."""
    data = edit.to_dict()
    keys = [f"{k}={data[k]}" for k in _SUMMARY_FIELDS if k in data]
    text = next((data[k] for k in ("text", "message", "hint") if k in data), None)
    if text is None and "steps" in data:
        text = " / ".join(data["steps"])
    shown = f" {str(text)[:60]!r}" if text else ""
    return f"{edit.kind}({', '.join(keys)}){shown}"


def pool_summary(pool: Pool) -> dict[str, Any]:
    """Returns the pool's members with edits and validation, and the union coverage."""
    members = []
    union: set[str] = set()
    validated_tasks: set[str] = set()
    for sibling in pool.members:
        record = pool.validation(sibling.id)
        entry: dict[str, Any] = {
            "id": sibling.id, "parent": sibling.parent, "round": sibling.round, "hash": sibling.content_hash,
            "root_causes": list(sibling.root_causes), "edits": [describe_edit(e) for e in sibling.patch.edits],
        }
        if record is not None:
            entry["validation"] = {
                "tasks": len(record.tasks), "solved": len(record.solved), "valid": record.valid, "reason": record.reason,
                "fixed_vs_parent": len(record.fixed_vs_parent), "broken_vs_parent": len(record.broken_vs_parent),
                "fixed_vs_h0": len(record.fixed_vs_h0), "broken_vs_h0": len(record.broken_vs_h0),
            }
            union |= set(record.solved)
            validated_tasks |= set(record.tasks)
        members.append(entry)
    return {
        "folder": str(pool.folder), "base": pool.base, "source": pool.source, "frozen": pool.frozen,
        "members": members, "union_solved": len(union), "validated_tasks": len(validated_tasks),
        "rounds": max((s.round for s in pool.members), default=0),
    }


def render_summary(summary: dict[str, Any]) -> str:
    """Returns the summary as text: one block per member, then a coverage table."""
    lines = [f"pool {summary['folder']}: H0 {summary['base']}, {len(summary['members'])} members, "
             f"{summary['source']}{' (frozen)' if summary['frozen'] else ''}"]
    for m in summary["members"]:
        causes = f" targets {', '.join(m['root_causes'])}" if m["root_causes"] else ""
        lines.append(f"- {m['id']} [round {m['round']}, parent {m['parent'] or '-'}, hash {m['hash']}]{causes}")
        lines += [f"    {e}" for e in m["edits"]]
    rows = [m for m in summary["members"] if "validation" in m]
    if rows:
        lines += ["", f"{'sibling':<24} {'solved':>7} {'+parent':>8} {'-parent':>8} {'+H0':>5} {'-H0':>5}  valid"]
        for m in rows:
            v = m["validation"]
            lines.append(f"{m['id']:<24} {v['solved']:>3}/{v['tasks']:<3} {v['fixed_vs_parent']:>8} "
                         f"{v['broken_vs_parent']:>8} {v['fixed_vs_h0']:>5} {v['broken_vs_h0']:>5}  "
                         f"{'yes' if v['valid'] else 'no: ' + v['reason']}")
        lines.append(f"union coverage: {summary['union_solved']} of {summary['validated_tasks']} validation tasks")
    return "\n".join(lines)
