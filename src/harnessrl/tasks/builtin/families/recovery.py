"""The ``recovery`` family: the obvious first command fails and the agent has to notice and adapt.

Moved files, unsupported tool flags, malformed CSV rows and missing output folders; the
gold solutions start with the naive command that fails, then recover.
"""

from __future__ import annotations

from harnessrl.tasks.builtin.families.common import (
    GenContext,
    Templates,
    csv_text,
    lines_text,
    money,
    number_answer,
)
from harnessrl.tasks.builtin.families.files import filler_lines
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, FileContains, FileEquals, JsonField

SKILLS = ("error-recovery",)


def archive_name(ctx: GenContext) -> str:
    """Returns the split's name for the folder old files are moved to."""
    return "attic" if ctx.is_test else "archive"


MOVED_FILE = Templates(
    "recovery.moved_file",
    train=(
        "How many lines of `{path}` contain `{level}`? Submit the number.",
        "Count the `{level}` lines in the log `{path}` and submit the count.",
        "Submit the number of lines that include `{level}` in `{path}`.",
    ),
    test=(
        "In the log file `{path}`, how many lines mention `{level}`? Answer with the number.",
        "Report how many `{level}` entries (lines containing `{level}`) the file `{path}` has.",
        "Tell me the count of lines with `{level}` in `{path}`; submit just the number.",
    ),
)

TOOL_FLAG = Templates(
    "recovery.tool_flag",
    train=(
        "Use the helper script to summarise `{source}`: run `{command}`. The result must end up in `{out}` exactly as the tool writes it.",
        "Our docs say the summary of `{source}` is produced with `{command}`. Produce `{out}` with that tool (do not write the file by hand).",
        "Generate `{out}` by running the bundled tool like this: `{command}`. Adapt the command if needed, but the file must be the tool's own output.",
    ),
    test=(
        "Create `{out}` with the summariser in `tools/`. The old instructions say: `{command}`. The output must come from the tool itself.",
        "Run `{command}` to summarise `{source}` into `{out}` (the tool's output format is what counts; fix the invocation if it fails).",
        "According to an outdated note, `{command}` writes the summary of `{source}` to `{out}`. Get that file produced by the tool.",
    ),
)

MALFORMED = Templates(
    "recovery.malformed_csv",
    train=(
        "Compute the sum of the `{column}` column of `{path}`. Some rows are malformed: a row is invalid if it does not have exactly {width} fields or its `{column}` is not a number. Skip invalid rows. Write `{out}` as a JSON object {{\"{total_key}\": <sum of valid rows, 2 decimals>, \"{skip_key}\": <number of invalid rows>}}.",
        "Add up `{column}` over the valid rows of `{path}` (valid = exactly {width} fields and a numeric `{column}`; skip anything else) and save {{\"{total_key}\": <sum>, \"{skip_key}\": <count of skipped rows>}} as JSON in `{out}`.",
        "`{path}` has a few broken rows. Ignoring rows that do not have {width} fields or whose `{column}` is not numeric, total the `{column}` column. Write the JSON object {{\"{total_key}\": total, \"{skip_key}\": how many rows were ignored}} to `{out}`.",
    ),
    test=(
        "Sum `{column}` in `{path}`, skipping every row that is not well-formed ({width} fields, numeric `{column}`). Store {{\"{total_key}\": <the sum>, \"{skip_key}\": <rows skipped>}} in `{out}` (JSON).",
        "Some lines of `{path}` are corrupt. Treat a row as valid only when it has {width} fields and a numeric `{column}`. Write to `{out}` a JSON object with `{total_key}` (sum of `{column}` over valid rows) and `{skip_key}` (number of invalid rows).",
        "Please total the `{column}` values of `{path}`. Rows without exactly {width} fields, or with a non-numeric `{column}`, must be left out and counted. Result as JSON in `{out}`: keys `{total_key}` and `{skip_key}`.",
    ),
)

PIPELINE = Templates(
    "recovery.pipeline",
    train=(
        "Run `python3 {script}` to produce the report configured in `{settings}`. Do not modify `{script}`; if the run fails, fix whatever else is wrong and run it again until the report exists.",
        "The pipeline `{script}` (configured by `{settings}`) must produce its report. It currently fails. Make it succeed without editing `{script}` itself, then run it.",
        "Get `python3 {script}` to run to completion so that the output named in `{settings}` is written. You may change the workspace and the settings, but not `{script}`.",
    ),
    test=(
        "Our report job is `python3 {script}`, reading its paths from `{settings}`. It breaks at the moment. Repair the setup (not the script) and run it so the report gets generated.",
        "Produce the report by running `{script}` with Python. The script must stay unchanged; adjust `{settings}` or the folders as needed until it completes.",
        "`python3 {script}` should write the report whose path is in `{settings}`. Investigate the failures, fix their causes without touching `{script}`, and run it successfully.",
    ),
)


def tier1(ctx: GenContext) -> Task:
    """The named log was moved to an archive folder; find it and count lines in it."""
    folder, stem, *others = ctx.words(5)
    level = "ALERT" if ctx.is_test else "WARN"
    files: dict[str, str | bytes] = {}

    def log_lines(hits: int) -> list[str]:
        lines = [f"INFO {line}" for line in filler_lines(ctx, ctx.rng.randint(4, 8))]
        for _ in range(hits):
            lines.insert(ctx.rng.randint(0, len(lines)), f"{level} {filler_lines(ctx, 1)[0]}")
        return lines

    hits = ctx.rng.randint(1, 5)
    moved = f"{folder}/{archive_name(ctx)}/{stem}.log"
    files[moved] = lines_text(log_lines(hits))
    for other in others:
        files[f"{folder}/{other}.log"] = lines_text(log_lines(ctx.rng.randint(0, 4)))
    path = f"{folder}/{stem}.log"
    return ctx.task(
        subtype="moved_file",
        instruction=ctx.say(MOVED_FILE, path=path, level=level),
        verifier=number_answer(hits),
        gold=[Action.run(f"grep -c '{level}' {path}"), Action.run(f"find . -name '{stem}.log'"),
              Action.run(f"grep -c '{level}' {moved}"), Action.submit(str(hits))],
        files=files,
        skills=(*SKILLS, "search", "moved-file"),
        expects_answer=True,
    )


_TOOL = '''"""Summarise one numeric column of a CSV file."""
import argparse
import csv

parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
parser.add_argument("source", help="CSV file to read")
parser.add_argument("--{col_flag}", required=True, help="name of the numeric column")
parser.add_argument("--{stat_flag}", required=True, choices=["sum", "max", "min"])
parser.add_argument("--{out_flag}", required=True, help="file to write the summary to")
args = parser.parse_args()
values = [float(row[args.{col_flag}]) for row in csv.DictReader(open(args.source))]
result = {{"sum": sum, "max": max, "min": min}}[args.{stat_flag}](values)
with open(args.{out_flag}, "w") as out:
    out.write(f"{{args.{stat_flag}}}({{args.{col_flag}}}) = {{result:.2f}}\\n")
print("wrote", args.{out_flag})
'''


def tier2(ctx: GenContext) -> Task:
    """A documented tool flag does not exist; read ``--help`` and rerun with the right one."""
    tool_stem, src_stem, out_stem = ctx.words(3)
    if ctx.is_test:
        col_flag, stat_flag, out_flag, wrong_flag = "field", "op", "dest", "target"
        columns = ("owner", "hours", "rate")
    else:
        col_flag, stat_flag, out_flag, wrong_flag = "column", "stat", "out", "output"
        columns = ("name", "weight", "price")
    tool = f"tools/{tool_stem}.py"
    source = f"{src_stem}.csv"
    out = f"{out_stem}.txt"
    rows = [(ctx.choice(ctx.vocab.people), ctx.rng.randint(1, 400), money(ctx.rng.randint(100, 9000)))
            for _ in range(ctx.rng.randint(5, 10))]
    column = ctx.choice(columns[1:])
    stat = ctx.choice(("sum", "max", "min"))
    values = [float(r[columns.index(column)]) for r in rows]
    result = {"sum": sum, "max": max, "min": min}[stat](values)
    expected = f"{stat}({column}) = {result:.2f}\n"
    command = f"python3 {tool} {source} --{col_flag} {column} --{stat_flag} {stat} --{wrong_flag} {out}"
    fixed = f"python3 {tool} {source} --{col_flag} {column} --{stat_flag} {stat} --{out_flag} {out}"
    tool_source = _TOOL.format(col_flag=col_flag, stat_flag=stat_flag, out_flag=out_flag)
    return ctx.task(
        subtype="tool_flag",
        instruction=ctx.say(TOOL_FLAG, source=source, command=command, out=out),
        verifier=AllOf(checks=(FileEquals(out, expected), FileEquals(tool, tool_source))),
        gold=[Action.run(command), Action.run(f"python3 {tool} --help"), Action.run(fixed)],
        files={tool: tool_source, source: csv_text(columns, rows)},
        skills=(*SKILLS, "tool-use", "unsupported-flag"),
    )


_ROBUST_SCRIPT = """python3 - <<'PY'
import csv, json
total, skipped = 0.0, 0
with open({path!r}) as handle:
    reader = csv.reader(handle)
    header = next(reader)
    col = header.index({column!r})
    for row in reader:
        try:
            if len(row) != len(header):
                raise ValueError("wrong field count")
            total += float(row[col])
        except ValueError:
            skipped += 1
json.dump({{{total_key!r}: round(total, 2), {skip_key!r}: skipped}}, open({out!r}, "w"))
PY"""


def tier3(ctx: GenContext) -> Task:
    """A CSV with malformed rows: the naive sum crashes; skip and count the bad rows."""
    src_stem, out_stem = ctx.words(2)
    if ctx.is_test:
        header, column, total_key, skip_key = ("ref", "owner", "hours", "site"), "hours", "sum", "invalid"
    else:
        header, column, total_key, skip_key = ("id", "name", "amount", "city"), "amount", "total", "skipped"
    places = ctx.vocab.places
    rows: list[list[str]] = []
    cents = 0
    for n in range(ctx.rng.randint(8, 14)):
        value = ctx.rng.randint(100, 50000)
        cents += value
        rows.append([str(100 + n), ctx.choice(ctx.vocab.people), money(value), ctx.choice(places)])
    bad_rows = [
        lambda n: [str(n), ctx.choice(ctx.vocab.people), ctx.choice(("n/a", "unknown", "", "1O.5", "TBD")), ctx.choice(places)],
        lambda n: [str(n), ctx.choice(ctx.vocab.people), money(ctx.rng.randint(100, 900))],
        lambda n: [str(n), ctx.choice(ctx.vocab.people), money(ctx.rng.randint(100, 900)), ctx.choice(places), "extra"],
    ]
    skipped = ctx.rng.randint(1, 3)
    for k in range(skipped):
        make = bad_rows[0] if k == 0 else ctx.choice(bad_rows)
        rows.insert(ctx.rng.randint(1, len(rows)), make(900 + k))
    path, out = f"{src_stem}.csv", f"{out_stem}.json"
    text = csv_text(header, [])  # header line only; rows are written raw so bad ones stay bad
    text += "".join(",".join(row) + "\n" for row in rows)
    naive = (f"python3 -c \"import csv; print(sum(float(r['{column}']) for r in "
             f"csv.DictReader(open('{path}'))))\"")
    return ctx.task(
        subtype="malformed_csv",
        instruction=ctx.say(MALFORMED, path=path, column=column, width=len(header), out=out,
                            total_key=total_key, skip_key=skip_key),
        verifier=AllOf(checks=(JsonField(out, total_key, cents / 100, tolerance=0.006),
                               JsonField(out, skip_key, skipped))),
        gold=[Action.run(naive), Action.run(f"cat -n {path}"),
              Action.run(_ROBUST_SCRIPT.format(path=path, column=column, out=out,
                                               total_key=total_key, skip_key=skip_key)),
              Action.run(f"cat {out}")],
        files={path: text},
        skills=(*SKILLS, "data", "malformed-input"),
    )


_PIPELINE = '''"""Report job: per-{group} totals of the input CSV, written to the configured output."""
import configparser
import csv

config = configparser.ConfigParser()
config.read("{settings}")
section = config["{section}"]
totals = {{}}
with open(section["input"]) as handle:
    for row in csv.DictReader(handle):
        totals[row["{group}"]] = totals.get(row["{group}"], 0) + int(row["{qty}"])
with open(section["output"], "w") as out:  # the output folder must already exist
    for key in sorted(totals):
        out.write(f"{{key}}: {{totals[key]}}\\n")
print("report written to", section["output"])
'''


def tier4(ctx: GenContext) -> Task:
    """A pipeline fails twice (moved input, missing output folder); fix config and folders."""
    script_stem, settings_stem, data_dir, raw_dir, build_dir, report_dir, input_stem, out_stem = ctx.words(8)
    if ctx.is_test:
        group, qty, section = "team", "units", "job"
    else:
        group, qty, section = "category", "qty", "pipeline"
    script, settings = f"{script_stem}.py", f"{settings_stem}.ini"
    configured_input = f"{data_dir}/{raw_dir}/{input_stem}.csv"
    actual_input = f"{data_dir}/{archive_name(ctx)}/{input_stem}.csv"
    output = f"{build_dir}/{report_dir}/{out_stem}.txt"
    rows = [(ctx.choice(ctx.vocab.items), ctx.choice(ctx.vocab.categories), ctx.rng.randint(1, 20))
            for _ in range(ctx.rng.randint(6, 12))]
    totals: dict[str, int] = {}
    for _, cat, n in rows:
        totals[cat] = totals.get(cat, 0) + n
    expected = lines_text(f"{k}: {totals[k]}" for k in sorted(totals))
    script_text = _PIPELINE.format(settings=settings, section=section, group=group, qty=qty)
    settings_text = lines_text([f"[{section}]", f"input = {configured_input}", f"output = {output}"])
    files: dict[str, str | bytes] = {
        script: script_text,
        settings: settings_text,
        actual_input: csv_text(("item", group, qty), rows),
        f"{data_dir}/{raw_dir}/{out_stem}_readme.txt": lines_text(
            [f"Input files were moved to {data_dir}/{archive_name(ctx)}/ during cleanup."]
            if ctx.rng.random() < 0.5 else filler_lines(ctx, 1)),
    }
    return ctx.task(
        subtype="pipeline",
        instruction=ctx.say(PIPELINE, script=script, settings=settings),
        verifier=AllOf(checks=(FileEquals(output, expected), FileEquals(script, script_text),
                               FileContains(settings, actual_input))),
        gold=[
            Action.run(f"python3 {script}"),
            Action.run(f"cat {settings}; find {data_dir} -name '{input_stem}.csv'"),
            Action.edit(settings, f"input = {configured_input}", f"input = {actual_input}"),
            Action.run(f"python3 {script}"),
            Action.run(f"mkdir -p {build_dir}/{report_dir}"),
            Action.run(f"python3 {script}"),
            Action.run(f"cat {output}"),
        ],
        files=files,
        skills=(*SKILLS, "config", "moved-file", "missing-directory"),
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
