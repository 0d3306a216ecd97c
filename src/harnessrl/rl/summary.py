"""A training run's summary: base vs trained Pass@1 per evaluation set, as data and as Markdown."""

from __future__ import annotations

from typing import Any


def run_summary(state: dict[str, Any], **run: Any) -> dict[str, Any]:
    """Returns a run's summary from its trainer state (``base_eval``, ``final_eval``,
    ``warm_start``) and what describes the run (``run``: run_dir, steps, design, algorithm,
    train_configs, held_out, eval_tasks, precision)."""
    base, final = state.get("base_eval", {}), state.get("final_eval", {})
    rows = {}
    for name in sorted(set(base) | set(final)):
        before = base.get(name, {}).get("pass_at_1")
        after = final.get(name, {}).get("pass_at_1")
        rows[name] = {
            "base_pass_at_1": before, "trained_pass_at_1": after,
            "base_ci": base.get(name, {}).get("pass_at_1_ci"),
            "trained_ci": final.get(name, {}).get("pass_at_1_ci"),
            "episodes": final.get(name, {}).get("episodes"),
            "delta": None if before is None or after is None else after - before,
            # What a small model learns first is the harness's format: report it beside Pass@1.
            "base_format_error_rate": base.get(name, {}).get("format_error_rate"),
            "trained_format_error_rate": final.get(name, {}).get("format_error_rate"),
        }
    return {**run, "pass_at_1": rows, "warm_start": state.get("warm_start")}


def format_summary(summary: dict[str, Any]) -> str:
    """Returns the Markdown summary of a run: base vs trained Pass@1 per evaluation set."""
    lines = [
        f"# Training run `{summary['run_dir']}`",
        "",
        f"{summary['steps']} {summary.get('algorithm', 'grpo').upper()} steps over the `{summary['design']}` design "
        f"({len(summary['train_configs'])} configurations); evaluated on {len(summary['eval_tasks'])} test tasks.",
        "",
        "| evaluation set | episodes | base Pass@1 | trained Pass@1 | 95% CI (trained) | change "
        "| format errors per turn (base -> trained) |",
        "|---|---|---|---|---|---|---|",
    ]

    def fmt(v: Any) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}"

    for name, row in summary["pass_at_1"].items():
        ci = row.get("trained_ci") or [None, None]
        ci_text = "n/a" if ci[0] is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
        delta = "n/a" if row["delta"] is None else f"{100 * row['delta']:+.1f}"
        errors = " -> ".join(
            "n/a" if rate is None else f"{100 * rate:.1f}%"
            for rate in (row.get("base_format_error_rate"), row.get("trained_format_error_rate"))
        )
        lines.append(
            f"| {name} | {row.get('episodes') or 'n/a'} | {fmt(row['base_pass_at_1'])} | {fmt(row['trained_pass_at_1'])} "
            f"| {ci_text} | {delta} | {errors} |"
        )
    lines += ["", f"In-space held-out configurations: {', '.join(summary['held_out'])}."]
    return "\n".join(lines) + "\n"
