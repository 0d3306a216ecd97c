"""Static reports: one HTML page (plus a Markdown twin) with plots, tables and transcripts.

A report is a folder ``report/`` with ``index.html``, ``report.md`` and ``img/*.png``
(matplotlib, Agg backend); the HTML needs no server and no network. The page checks itself
when it loads: a script error or an image that fails to load shows a red banner and sets
``data-report-check`` on ``<html>`` (the headless-browser test reads it).

Builders: ``eval_sections`` (the results of one evaluation), ``write_run_report`` (a
training run folder), ``write_eval_report`` (an `harnessrl eval` output folder);
``harnessrl.experiment`` builds the experiment report with the same ``Doc``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harnessrl.eval.behaviour import BEHAVIOURS, LOWER_IS_BETTER
from harnessrl.harness.base import SPAN_KINDS
from harnessrl.trajectory import Trajectory, expand_runs, load_jsonl

Decoder = Callable[[Sequence[int]], str]
GROUP_LABELS = {"train": "training configs", "in_space": "in-space (held-out)", "out_of_space": "out-of-space",
                "external": "external agents", "sibling": "sibling harnesses"}
SPAN_COLOURS = {"system": "#e8eaf6", "task": "#e0f2f1", "policy": "#fff3e0", "observation": "#f1f8e9",
                "reminder": "#fce4ec", "summary": "#ede7f6", "format": "#eeeeee"}
_MAX_SPAN_CHARS = 1500

_CHECK_HEAD = """<script>
window.__reportErrors = [];
window.addEventListener('error', function (e) {
  window.__reportErrors.push(e.message ? String(e.message) : 'resource failed: ' + (e.target && e.target.src));
}, true);
</script>"""
_CHECK_TAIL = """<script>
window.addEventListener('load', function () {
  var broken = [];
  document.querySelectorAll('img').forEach(function (img) {
    if (!img.complete || img.naturalWidth === 0) { broken.push(img.getAttribute('src')); }
  });
  var result = {errors: window.__reportErrors, broken_images: broken, images: document.images.length};
  document.documentElement.setAttribute('data-report-check', JSON.stringify(result));
  if (broken.length || window.__reportErrors.length) {
    var banner = document.createElement('div');
    banner.className = 'banner';
    banner.textContent = 'This report has problems: ' + JSON.stringify(result);
    document.body.insertBefore(banner, document.body.firstChild);
  }
});
</script>"""
_STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f5f5f5; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #555; }
details { margin: 0.6em 0; border: 1px solid #ddd; border-radius: 4px; padding: 0.4em 0.8em; }
summary { cursor: pointer; font-weight: 600; }
.span { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.85em; margin: 0.2em 0;
        padding: 0.3em 0.5em; border-left: 4px solid #999; }
.label { font-weight: 700; font-size: 0.8em; text-transform: uppercase; color: #555; }
.banner { background: #c62828; color: white; padding: 0.6em; font-weight: 700; }
.note { color: #555; font-size: 0.92em; }
</style>"""


class Doc:
    """A report under construction: blocks rendered both as HTML and as Markdown."""

    def __init__(self, title: str, folder: str | Path) -> None:
        self.title = title
        self.folder = Path(folder)
        self.img_dir = self.folder / "img"
        self.blocks: list[tuple[str, Any]] = []

    # -- blocks ---------------------------------------------------------------------------
    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.blocks.append(("table", (list(headers), [[_cell(v) for v in row] for row in rows])))

    def figure(self, name: str, fig: Any, caption: str) -> None:
        """Saves a matplotlib figure as img/<name>.png and adds it."""
        import matplotlib.pyplot as plt

        self.img_dir.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.img_dir / f"{name}.png", dpi=90, bbox_inches="tight")
        plt.close(fig)
        self.blocks.append(("figure", (f"img/{name}.png", caption)))

    def transcript(self, title: str, segments: Sequence[tuple[str, str]]) -> None:
        """Adds a collapsible transcript: (span label, text) segments."""
        self.blocks.append(("transcript", (title, list(segments))))

    def link(self, text: str, href: str) -> None:
        self.blocks.append(("link", (text, href)))

    # -- rendering ----------------------------------------------------------------------------
    def html(self) -> str:
        out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
               f"<title>{html.escape(self.title)}</title>", _STYLE, _CHECK_HEAD, "</head><body>",
               f"<h1>{html.escape(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                out.append(f"<h{level}>{html.escape(text)}</h{level}>")
            elif kind == "para":
                out.append(f"<p>{html.escape(value)}</p>")
            elif kind == "table":
                headers, rows = value
                out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr></thead><tbody>")
                out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
                out.append("</tbody></table>")
            elif kind == "figure":
                src, caption = value
                out.append(f"<figure><img src='{html.escape(src)}' alt='{html.escape(caption)}'>"
                           f"<figcaption>{html.escape(caption)}</figcaption></figure>")
            elif kind == "transcript":
                title, segments = value
                out.append(f"<details><summary>{html.escape(title)}</summary>")
                for label, text in segments:
                    colour = SPAN_COLOURS.get(label, "#ffffff")
                    out.append(f"<div class='span' style='background:{colour}'><span class='label'>"
                               f"[{html.escape(label)}]</span>\n{html.escape(text)}</div>")
                out.append("</details>")
            elif kind == "link":
                text, href = value
                out.append(f"<p><a href='{html.escape(href)}'>{html.escape(text)}</a></p>")
        out += [_CHECK_TAIL, "</body></html>"]
        return "\n".join(out) + "\n"

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                out += [f"{'#' * level} {text}", ""]
            elif kind == "para":
                out += [value, ""]
            elif kind == "table":
                headers, rows = value
                out.append("| " + " | ".join(headers) + " |")
                out.append("|" + "---|" * len(headers))
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
                out.append("")
            elif kind == "figure":
                src, caption = value
                out += [f"![{caption}]({src})", "", f"*{caption}*", ""]
            elif kind == "transcript":
                title, segments = value
                out += [f"**{title}**", "", "```text"]
                out += [f"[{label}] {text}" for label, text in segments]
                out += ["```", ""]
            elif kind == "link":
                text, href = value
                out += [f"[{text}]({href})", ""]
        return "\n".join(out) + "\n"

    def write(self) -> Path:
        """Writes index.html and report.md into the folder; returns the HTML path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "report.md").write_text(self.markdown(), encoding="utf-8")
        path = self.folder / "index.html"
        path.write_text(self.html(), encoding="utf-8")
        return path


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def pct(value: float | None) -> str:
    """Returns a rate as a percentage with one decimal ('n/a' for None)."""
    return "n/a" if value is None else f"{100 * value:.1f}"


def pct_ci(ci: Sequence[float] | None) -> str:
    return "n/a" if not ci or ci[0] is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def signed(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}"


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- plots --------------------------------------------------------------------------------------


def plot_per_config(per_config: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]] | None) -> Any:
    """Returns a bar chart of Pass@1 per harness (and the baseline's, side by side)."""
    plt = pyplot()
    codes = sorted(per_config, key=lambda c: (per_config[c].get("group", ""), c))
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(codes) + 2), 3.6))
    xs = list(range(len(codes)))
    width = 0.4 if baseline else 0.7
    values = [100 * per_config[c]["pass_at_1"] for c in codes]
    bars = [(xs, values, "#1e88e5", None)]
    if baseline:
        base = [100 * baseline.get(c, {}).get("pass_at_1", 0.0) for c in codes]
        bars = [([x - width / 2 for x in xs], base, "#9e9e9e", "before"),
                ([x + width / 2 for x in xs], values, "#1e88e5", "after")]
    for positions, heights, colour, label in bars:
        ax.bar(positions, heights, width, label=label, color=colour)
        # A bar of height 0 draws nothing: a short mark on the axis shows it is there, at 0.
        zeros = [x for x, h in zip(positions, heights, strict=True) if h == 0]
        if zeros:
            ax.scatter(zeros, [0.8] * len(zeros), marker="_", s=(72 * width) ** 2 / 4, color=colour,
                       linewidths=3, zorder=3, clip_on=False)
    if baseline:
        ax.legend()
    ax.set_xticks(xs, codes, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("Pass@1 (%)")
    ax.set_ylim(0, 100)
    return fig


def plot_level_heatmap(marginals: dict[str, dict[str, Any]], title: str = "") -> Any:
    """Returns a factor x level heatmap of Pass@1 (cells annotated with episodes)."""
    plt = pyplot()
    letters = list(marginals)
    n_levels = max((len(v) for v in marginals.values()), default=0)
    grid = [[(marginals[f].get(str(lv)) or {}).get("pass_at_1") for lv in range(n_levels)] for f in letters]
    fig, ax = plt.subplots(figsize=(1.2 * n_levels + 2, 0.5 * len(letters) + 1.2))
    data = [[float("nan") if v is None else 100 * v for v in row] for row in grid]
    image = ax.imshow(data, vmin=0, vmax=100, cmap="viridis", aspect="auto")
    for i, f in enumerate(letters):
        for lv in range(n_levels):
            cell = marginals[f].get(str(lv)) or {}
            text = "–" if cell.get("pass_at_1") is None else f"{100 * cell['pass_at_1']:.0f}\n(n={cell['episodes']})"
            bright = (cell.get("pass_at_1") or 0.0) > 0.6  # viridis is light at the top: dark text there
            ax.text(lv, i, text, ha="center", va="center", fontsize=7, color="black" if bright else "white")
    ax.set_xticks(range(n_levels), [f"level {lv}" for lv in range(n_levels)])
    ax.set_yticks(range(len(letters)), letters)
    fig.colorbar(image, ax=ax, label="Pass@1 (%)")
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def plot_distance(curves: dict[str, dict[str, dict[str, Any]]]) -> Any:
    """Returns Pass@1 against Hamming distance to the nearest training configuration, one line per label."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for label, curve in curves.items():
        xs = [int(d) for d in curve]
        ax.plot(xs, [100 * (curve[str(d)]["pass_at_1"] or 0.0) for d in xs], marker="o", label=label)
    ax.set_xlabel("Hamming distance to nearest training config")
    ax.set_ylabel("Pass@1 (%)")
    ax.set_ylim(0, 100)
    if len(curves) > 1:
        ax.legend(fontsize=7)
    return fig


# The update's diagnostics in metrics.jsonl (rl/update.py, rl/losses.py), plotted under the curves.
UPDATE_DIAGNOSTICS = ("update/pg_loss", "update/kl_ref", "update/approx_kl", "update/entropy",
                      "update/grad_norm", "lr", "update/clipfrac_low", "update/clipfrac_high")


def plot_learning_curves(series: dict[str, list[dict[str, Any]]], keys: Sequence[str], per_row: int = 4,
                         lines: dict[str, float] | None = None) -> Any:
    """Returns one panel per metric key (``per_row`` to a row), one line per run label,
    against the step (integer ticks: steps are counted from 1); ``lines`` draws each
    label's value as a dashed horizontal line in every panel (e.g. the SFT-only control)."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    columns = min(per_row, len(keys))
    rows = -(-len(keys) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for label, records in series.items():
            points = [(r["step"] + 1, r[key]) for r in records if r.get(key) is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        for label, value in (lines or {}).items():
            ax.axhline(value, linestyle="--", color="grey", label=label)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(key, fontsize=9)
    if len(series) + len(lines or {}) > 1:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()  # a panel's title clears the step label of the panel above
    return fig


# What a step's training rollouts show, in metrics.jsonl: the first pass's reward (before dynamic
# sampling chose groups), the trained groups' reward and signal, and the task frontier.
TRAINING_CURVES = ("sampling/first_pass_reward", "reward_mean", "valid_group_ratio", "no_signal_fraction",
                   "frontier/size", "sampling/extra_rollouts")


def curve_keys(records: Sequence[dict[str, Any]], keys: Sequence[str] = TRAINING_CURVES) -> list[str]:
    """Returns the keys of ``keys`` that some record has a value for."""
    return [key for key in keys if any(r.get(key) is not None for r in records)]


def eval_curve(run_dir: Path, records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Returns a run's held-out Pass@1 per evaluation set at each point it was evaluated:
    before step 1 (the base: the warm start), every ``eval_every`` steps, and after the last
    step; each point's ``step`` is the updates done minus one (``plot_learning_curves`` adds 1)."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
    curves: dict[str, list[dict[str, Any]]] = {}
    for name, row in (summary.get("pass_at_1") or {}).items():
        if row.get("base_pass_at_1") is not None:
            curves.setdefault(name, []).append({"step": -1, "pass_at_1": row["base_pass_at_1"]})
    for record in records:
        for name, scores in (record.get("eval") or {}).items():
            curves.setdefault(name, []).append({"step": record["step"], "pass_at_1": scores["pass_at_1"]})
    for name, row in (summary.get("pass_at_1") or {}).items():
        if row.get("trained_pass_at_1") is not None and summary.get("steps"):
            curves.setdefault(name, []).append({"step": int(summary["steps"]) - 1, "pass_at_1": row["trained_pass_at_1"]})
    return {name: sorted(points, key=lambda p: p["step"]) for name, points in curves.items()}


# --- transcripts ----------------------------------------------------------------------------------


def is_scripted_policy(name: str) -> bool:
    """Returns whether trajectories recorded under policy ``name`` were written by a scripted
    policy (tokenized bytewise). One rule for all of them: a model-backed policy is named
    ``<backend>:<model>`` (``hf:``, ``vllm:``, ``openai:``), a scripted one by a bare word
    (``oracle``, ``random``, ``replay``, ``gold-replay``, ``callback``, ``faulty``)."""
    return bool(name) and ":" not in name


def make_decoder(trajectories: Sequence[Trajectory], model: str | None = None) -> Decoder | None:
    """Returns a token decoder for these trajectories (bytes for scripted policies, the model's
    tokenizer otherwise), or None when no tokenizer can be loaded (spans then show counts)."""
    names = {t.policy for t in trajectories}
    if names and all(is_scripted_policy(n) for n in names):
        from harnessrl.harness.chat import ByteTokenizer

        return ByteTokenizer().decode
    try:
        from transformers import AutoTokenizer

        from harnessrl.policy.embedded import resolve_model_path

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model), local_files_only=True)
        return lambda ids: tokenizer.decode(list(ids))
    except Exception:  # a report never fails for want of a tokenizer
        return None


def transcript_segments(trajectory: Trajectory, decode: Decoder | None) -> list[tuple[str, str]]:
    """Returns (span label, text): the first prompt span by span, then each turn's policy
    output and what the harness answered, with each later prompt's span composition."""
    segments: list[tuple[str, str]] = []
    for turn in trajectory.turns:
        labels = expand_runs(turn.prompt_spans)
        counts = {label: labels.count(label) for label in SPAN_KINDS if label in labels}
        composition = ", ".join(f"{k} {v}" for k, v in counts.items())
        if turn.index == 0 and decode is not None:
            position = 0
            for label, count in turn.prompt_spans:
                text = decode(turn.prompt_ids[position:position + count])
                position += count
                if label != "format" and text.strip():
                    segments.append((label, _clip(text)))
        segments.append(("format", f"turn {turn.index} ({turn.kind}): prompt of {len(turn.prompt_ids)} tokens — {composition}"))
        segments.append(("policy", _clip(turn.text)))
        if turn.observation:
            segments.append(("observation" if turn.calls else "reminder", _clip(turn.observation)))
    verdict = "; ".join(f"{'PASS' if v['passed'] else 'FAIL'} {v['name']}: {v['detail']}" for v in trajectory.verdict)
    segments.append(("format", f"status {trajectory.status}, reward {trajectory.reward:.1f}"
                     + (f", answer {trajectory.answer!r}" if trajectory.answer is not None else "")
                     + (f" — {verdict}" if verdict else "") + (f" — error: {trajectory.error}" if trajectory.error else "")))
    return segments


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_SPAN_CHARS else text[:_MAX_SPAN_CHARS] + f"… [{len(text) - _MAX_SPAN_CHARS} more characters]"


def sample_trajectories(trajectories: Sequence[Trajectory], n: int = 4) -> list[Trajectory]:
    """Returns up to n episodes: passes and failures alternately, spread over harnesses."""
    passed = [t for t in trajectories if t.passed]
    failed = [t for t in trajectories if not t.passed]
    chosen: list[Trajectory] = []
    seen_configs: set[str] = set()
    for pool in (passed, failed, passed, failed, passed, failed):
        for t in pool:
            if t not in chosen and t.config not in seen_configs:
                chosen.append(t)
                seen_configs.add(t.config)
                break
        if len(chosen) >= n:
            break
    for t in trajectories:  # fewer harnesses than n: fill up
        if len(chosen) >= n:
            break
        if t not in chosen:
            chosen.append(t)
    return chosen[:n]


# --- sections -------------------------------------------------------------------------------------


UNITS_NOTE = ("units: the (task, harness) pairs scored, each run k times; the 95% intervals are "
              "percentile bootstraps that resample units.")


def headline_headers(k: int) -> list[str]:
    """Returns the headline table's columns: with k = 1, pass@k and Avg@k are Pass@1 again and
    are left out (one Pass@1 column)."""
    at_k = [f"pass@{k}", "95% CI", f"Avg@{k}", "95% CI"] if k > 1 else []
    return ["set", "Pass@1", "95% CI", *at_k, "units", "episodes"]


def headline_rows(results: dict[str, Any]) -> list[list[str]]:
    """Returns table rows: overall and per group, Pass@1 (and, for k > 1, pass@k and Avg@k)
    with 95% intervals, in the columns of ``headline_headers``."""
    rows = []
    entries = [("overall", results)] + [(GROUP_LABELS.get(g, g), s) for g, s in sorted(results.get("per_group", {}).items())]
    for name, s in entries:
        at_k = [pct(s.get("pass_at_k")), pct_ci(s.get("pass_at_k_ci")), pct(s.get("avg_at_k")),
                pct_ci(s.get("avg_at_k_ci"))] if results.get("k", 1) > 1 else []
        rows.append([name, pct(s.get("pass_at_1")), pct_ci(s.get("pass_at_1_ci")), *at_k, s.get("tasks"), s.get("episodes")])
    return rows


def eval_sections(doc: Doc, results: dict[str, Any], trajectories: Sequence[Trajectory], name: str,
                  baseline: dict[str, Any] | None = None, decode: Decoder | None = None,
                  transcripts: int = 4) -> None:
    """Adds the sections of one evaluation: headline numbers, per-config bars, per-level
    heatmap, pairwise table, distance curve, behaviour metrics and sample transcripts."""
    k = results.get("k", 1)
    doc.heading("Headline numbers")
    doc.table(headline_headers(k), headline_rows(results))
    doc.para(UNITS_NOTE)
    if baseline is not None:
        doc.para("Before → after, Pass@1 per set: " + "; ".join(
            f"{GROUP_LABELS.get(g, g)} {pct(baseline.get('per_group', {}).get(g, {}).get('pass_at_1'))} → {pct(s['pass_at_1'])}"
            for g, s in sorted(results.get("per_group", {}).items())))
    per_config = results.get("per_config", {})
    if per_config:
        doc.heading("Per harness")
        doc.figure(f"{name}-per-config", plot_per_config(per_config, (baseline or {}).get("per_config")),
                   "Pass@1 per harness" + (" (grey: before, blue: after)" if baseline else ""))
        doc.table(["harness", "group", "Pass@1", "95% CI", "episodes", "unparsed outputs / turn", "tool errors / turn"],
                  [[c, GROUP_LABELS.get(s.get("group", ""), s.get("group", "")), pct(s["pass_at_1"]), pct_ci(s.get("pass_at_1_ci")),
                    s["episodes"], s.get("format_error_rate"), s.get("tool_error_rate")]
                   for c, s in sorted(per_config.items(), key=lambda kv: (kv[1].get("group", ""), kv[0]))])
    analysis = results.get("analysis") or {}
    if analysis.get("marginals") and any(
        cell["episodes"] for levels in analysis["marginals"].values() for cell in levels.values()
    ):
        doc.heading("Per factor level (in-space episodes)")
        doc.figure(f"{name}-levels", plot_level_heatmap(analysis["marginals"]),
                   "Pass@1 per level of each factor (marginal over the evaluated in-space configurations)")
        pairs = analysis.get("interactions", {})
        if pairs:
            some = next(iter(pairs.values()))
            cells = list(some)
            doc.para("Pairwise factor-level table: Pass@1 (%) of the episodes with level a of the first and level b "
                     "of the second factor; n/a where no evaluated configuration has that pair.")
            doc.table(["factors", *[f"{c}" for c in cells]],
                      [[pair, *[pct(table[c]["pass_at_1"]) for c in cells]] for pair, table in pairs.items()])
        if analysis.get("distance"):
            doc.figure(f"{name}-distance", plot_distance({name: analysis["distance"]}),
                       "Pass@1 against Hamming distance to the nearest training configuration")
            doc.table(["distance", "Pass@1", "episodes", "configs"],
                      [[d, pct(c["pass_at_1"]), c["episodes"], c["configs"]] for d, c in analysis["distance"].items()])
    behaviour = results.get("behaviour") or {}
    if behaviour.get("overall"):
        doc.heading("Behaviour metrics")
        doc.para("Definitions: docs/evaluation.md. Rate = count / opportunities pooled over episodes; "
                 "the two error rates are better when lower.")
        groups = sorted(behaviour.get("per_group", {}))
        base_b = (baseline or {}).get("behaviour", {}).get("overall", {})
        headers = ["behaviour", "overall", "count / opportunities", *[GROUP_LABELS.get(g, g) for g in groups]]
        if base_b:
            headers += ["before (overall)", "change"]
        rows = []
        for b in BEHAVIOURS:
            cell = behaviour["overall"][b]
            row = [b + (" (lower is better)" if b in LOWER_IS_BETTER else ""), pct(cell["rate"]),
                   f"{cell['count']} / {cell['opportunities']}",
                   *[pct(behaviour["per_group"][g][b]["rate"]) for g in groups]]
            if base_b:
                before = base_b.get(b, {}).get("rate")
                row += [pct(before), signed(None if before is None or cell["rate"] is None else cell["rate"] - before)]
            rows.append(row)
        doc.table(headers, rows)
    chosen = sample_trajectories(trajectories, transcripts)
    if chosen:
        doc.heading("Sample episodes")
        doc.para("Each segment carries the span label of its tokens (system, task, policy, observation, reminder, "
                 "summary); only policy tokens are trained.")
        for t in chosen:
            doc.transcript(f"{'PASS' if t.passed else 'FAIL'} · task {t.task_id} · harness {t.config} · {len(t.turns)} turns",
                           transcript_segments(t, decode))


# --- run and eval folders ---------------------------------------------------------------------------


def read_jsonl_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_run_report(run_dir: str | Path) -> Path:
    """(Re)builds ``RUN_DIR/report/`` from the files of a training run; returns the HTML path."""
    from harnessrl.design import make_design
    from harnessrl.eval.evaluate import score_trajectories
    from harnessrl.harness.registry import default_space

    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{run_dir}: not a training run (no config.json); pass a run, eval or experiment folder")
    cfg = json.loads(config_path.read_text(encoding="utf-8"))
    design = make_design(default_space(), cfg.get("design", "orthogonal"), n=cfg.get("design_n"),
                         seed=cfg.get("seed", 0), base=cfg.get("base_harness"))
    groups = {code: "train" for code in design.codes}
    doc = Doc(f"Training run {run_dir.name}", run_dir / "report")
    doc.para(f"{cfg.get('algorithm', 'grpo').upper()} over the {design.kind} design ({len(design)} configurations), "
             f"pairing {cfg.get('pairing')} K={cfg.get('k')}, {cfg.get('steps')} steps of {cfg.get('tasks_per_step')} "
             f"tasks x {cfg.get('group_size')} rollouts, model {cfg.get('model')}, seed {cfg.get('seed')}.")
    records = read_jsonl_records(run_dir / "metrics.jsonl")
    if records:
        doc.heading("Learning curves")
        doc.figure("learning-curves", plot_learning_curves({run_dir.name: records}, [*curve_keys(records), "pass_rate"]),
                   "Training rollouts per step: the first pass's mean reward (before dynamic sampling), the trained "
                   "groups' mean reward and valid-group ratio, groups without signal, the task frontier's size, "
                   "rollouts beyond the first pass, pass rate")
        diagnostics = [key for key in UPDATE_DIAGNOSTICS if any(r.get(key) is not None for r in records)]
        if diagnostics:
            doc.figure("update-diagnostics", plot_learning_curves({run_dir.name: records}, diagnostics),
                       "The update per step: policy loss, KL (to the reference; approximate, to the sampler), "
                       "entropy, gradient norm, learning rate, clip fractions (docs/evaluation.md)")
        periodic = eval_curve(run_dir, records)
        if any(len(points) > 1 for points in periodic.values()):
            base = {f"{name} before step 1": points[0]["pass_at_1"] for name, points in periodic.items()
                    if points and points[0]["step"] == -1}
            doc.figure("eval-curve", plot_learning_curves(periodic, ["pass_at_1"], lines=base),
                       "Held-out Pass@1 (greedy, the same tasks and configurations at every point) before step 1, "
                       "every eval_every steps and after the last; dashed: before step 1 (the warm start)")
        doc.table(["step", "reward", "pass rate", "no-signal", "trained samples", "format errors", "pairs"],
                  [[r["step"] + 1, r.get("reward_mean"), r.get("pass_rate"), r.get("no_signal_fraction"),
                    r.get("trained_samples"), r.get("format_errors"),
                    ", ".join(f"{p[0]}@{p[1]}" for p in r.get("pairs", []))[:160]] for r in records])
    evals = {p.stem: p for p in sorted((run_dir / "eval").glob("*.jsonl"))}
    final = evals.get("final") or (evals[sorted(evals)[-1]] if evals else None)
    if final is not None:
        trajectories = load_jsonl(final)
        results = score_trajectories(trajectories, 1, groups, design).to_dict()
        baseline = None
        if "base" in evals and final.stem != "base":
            baseline = score_trajectories(load_jsonl(evals["base"]), 1, groups, design).to_dict()
        doc.heading(f"Evaluation ({final.stem})", 2)
        eval_sections(doc, results, trajectories, "final", baseline, make_decoder(trajectories, cfg.get("model")))
    else:
        doc.para("No evaluation episodes were written yet (eval/*.jsonl).")
    return doc.write()


def write_eval_report(out_dir: str | Path, results: dict[str, Any] | None = None,
                      trajectories: Sequence[Trajectory] | None = None, model: str | None = None) -> Path:
    """(Re)builds ``OUT/report/`` of an `harnessrl eval` folder (results.json, trajectories.jsonl)."""
    out_dir = Path(out_dir)
    if results is None:
        path = out_dir / "results.json"
        if not path.exists():
            raise FileNotFoundError(f"{out_dir}: no results.json; pass a run, eval or experiment folder")
        results = json.loads(path.read_text(encoding="utf-8"))
    if trajectories is None:
        path = out_dir / "trajectories.jsonl"
        trajectories = load_jsonl(path) if path.exists() else []
    doc = Doc(f"Evaluation {out_dir.name}", out_dir / "report")
    meta = results.get("meta", {})
    # The header names what was evaluated: the run's model, else the policy (oracle, hf:<dir>, ...).
    shown = {"model": model or meta.get("model") or meta.get("policy") or meta.get("source") or "unknown"}
    shown.update({k: v for k, v in meta.items() if k != "model" and v is not None and not isinstance(v, (list, dict))})
    doc.para(", ".join(f"{k}: {v}" for k, v in shown.items()))
    eval_sections(doc, results, trajectories, "eval", decode=make_decoder(trajectories, model or meta.get("model")))
    return doc.write()
