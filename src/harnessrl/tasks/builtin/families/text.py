"""The ``text`` family: replace, insert, sort, dedupe, and fix the formatting of text files."""

from __future__ import annotations

from harnessrl.tasks.builtin.families.common import GenContext, Templates, lines_text
from harnessrl.tasks.builtin.families.files import filler_lines
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, Check, FileEquals

SKILLS = ("text-editing",)


def codename_document(ctx: GenContext, term: str, lines: int, mentions: int) -> list[str]:
    """Returns filler lines of which ``mentions`` (distinct lines) mention ``term`` once each."""
    body = filler_lines(ctx, lines)
    shapes = (
        "The {t} build ships on day {n}.",
        "Ask about {t} before the review.",
        "{t} depends on the {i}.",
        "Owner of {t}: {p}.",
    )
    for position in ctx.sample(range(lines), mentions):
        body[position] = ctx.choice(shapes).format(
            t=term, n=ctx.rng.randint(2, 60), i=ctx.choice(ctx.vocab.items),
            p=ctx.choice(ctx.vocab.people).title(),
        )
    return body


REPLACE = Templates(
    "text.replace",
    train=(
        "In `{path}`, replace every occurrence of `{old}` with `{new}`.",
        "The project codename changed from `{old}` to `{new}`. Update `{path}` accordingly (all occurrences).",
        "Edit `{path}` so that the word `{old}` no longer appears: each `{old}` must become `{new}`.",
    ),
    test=(
        "Substitute `{new}` for each `{old}` in the file `{path}`; change nothing else.",
        "`{path}` still says `{old}` in places; it should say `{new}` everywhere instead.",
        "Swap out all instances of `{old}` in `{path}`, writing `{new}` in their place.",
    ),
)

SORT_DEDUPE = Templates(
    "text.sort_dedupe",
    train=(
        "Sort the lines of `{path}` alphabetically and remove duplicate lines, saving the result back to `{path}`.",
        "`{path}` contains one name per line with repeats. Rewrite it so every name appears once, in alphabetical order.",
        "Deduplicate `{path}` and put its lines in ascending alphabetical order (in place).",
    ),
    test=(
        "Make `{path}` a sorted list without repeats: each distinct line once, A to Z, written back to the same file.",
        "Clean up the list in `{path}`: drop duplicated entries and order the remaining ones alphabetically.",
        "Overwrite `{path}` with its unique lines sorted in ascending order.",
    ),
)

INSERT = Templates(
    "text.insert_after",
    train=(
        "In `{path}`, insert the line `{line}` directly after the line `{after}`. Keep every other line unchanged.",
        "Add a new line reading `{line}` to `{path}`, right below the line `{after}`.",
        "`{path}` is missing the step `{line}`; it belongs immediately after `{after}`. Add it there.",
    ),
    test=(
        "Put `{line}` on its own line in `{path}`, just after `{after}`; the rest of the file must not change.",
        "Right after the line `{after}` of `{path}`, a line `{line}` should follow. Insert it.",
        "Extend `{path}` with the line `{line}`, placed immediately below `{after}`.",
    ),
)

NORMALISE = Templates(
    "text.normalise",
    train=(
        "Fix the formatting of `{path}`: {rules}",
        "`{path}` is a messy settings file. Rewrite it in place so that {rules_lower}",
        "Normalise `{path}` following these rules: {rules}",
    ),
    test=(
        "Tidy up `{path}` (edit it in place). Required format: {rules}",
        "Reformat the settings in `{path}`. The result must satisfy: {rules}",
        "Please clean `{path}` so that {rules_lower}",
    ),
)

CHANGELOG = Templates(
    "text.multi_file_replace",
    train=(
        "Replace the term `{old}` with `{new}` in every `.md` file in `{dir}/`. Then write `{dir}/{log}` with one line per file you changed, formatted `<file name>: <number of replacements>`, sorted by file name.",
        "The term `{old}` is retired; use `{new}` instead in all Markdown files of `{dir}/`. Record what you changed in `{dir}/{log}`: for each modified file a line `<file name>: <count>` (count = occurrences replaced), ordered by file name.",
        "Update all `{dir}/*.md` files so `{old}` reads `{new}`, and create `{dir}/{log}` listing each changed file as `<file name>: <replacements>` in alphabetical order of file name. Unchanged files are not listed.",
    ),
    test=(
        "Across the `.md` files of `{dir}/`, rename `{old}` to `{new}`. Afterwards produce `{dir}/{log}`: one `<file name>: <how many replaced>` line per file that changed, alphabetically by name.",
        "Every Markdown file in `{dir}/` mentioning `{old}` must mention `{new}` instead. Summarise the edit in `{dir}/{log}` as lines `<file name>: <replacement count>`, sorted by file name, listing only files that changed.",
        "Please do a project-wide substitution in `{dir}/` (`.md` files only): `{old}` -> `{new}`. Then write a change log `{dir}/{log}` containing `<file name>: <n>` for each touched file, n being its number of replacements, ordered by file name.",
    ),
)


def tier1(ctx: GenContext) -> Task:
    """One command: replace a term everywhere in one file."""
    folder, stem, old, new = ctx.words(4)
    path = f"{folder}/{stem}.md"
    mentions = ctx.rng.randint(2, 4)
    body = codename_document(ctx, old, ctx.rng.randint(6, 9), mentions)
    text = lines_text(body)
    expected = text.replace(old, new)
    return ctx.task(
        subtype="replace",
        instruction=ctx.say(REPLACE, path=path, old=old, new=new),
        verifier=FileEquals(path, expected),
        gold=[Action.run(f"sed -i 's/{old}/{new}/g' {path}")],
        files={path: text},
        skills=(*SKILLS, "shell"),
    )


def tier2(ctx: GenContext) -> Task:
    """Sort and dedupe a list, or insert a line after a marker line."""
    folder, stem = ctx.words(2)
    path = f"{folder}/{stem}.txt"
    if ctx.rng.random() < 0.5:
        pool = [*ctx.vocab.people, *ctx.vocab.items]
        distinct = ctx.sample(pool, ctx.rng.randint(6, 9))
        lines = distinct + ctx.sample(distinct, ctx.rng.randint(2, 4))
        ctx.rng.shuffle(lines)
        text = lines_text(lines)
        return ctx.task(
            subtype="sort_dedupe",
            instruction=ctx.say(SORT_DEDUPE, path=path),
            verifier=FileEquals(path, lines_text(sorted(set(lines)))),
            gold=[Action.run(f"cat {path}"), Action.run(f"LC_ALL=C sort -u -o {path} {path}")],
            files={path: text},
            skills=(*SKILLS, "shell"),
        )
    items = ctx.sample(ctx.vocab.items, 6)
    verbs = ("pack", "check", "label", "weigh", "clean", "store")
    steps = [f"{n + 1}. {verb} the {item}" for n, (verb, item) in enumerate(zip(verbs, items[:5], strict=False))]
    at = ctx.rng.randint(0, len(steps) - 2)
    after = steps[at]
    line = f"{at + 1}b. {verbs[5]} the {items[5]}"
    text = lines_text(steps)
    expected = lines_text([*steps[: at + 1], line, *steps[at + 1 :]])
    return ctx.task(
        subtype="insert_after",
        instruction=ctx.say(INSERT, path=path, line=line, after=after),
        verifier=FileEquals(path, expected),
        gold=[Action.run(f"cat {path}"), Action.edit(path, f"{after}\n", f"{after}\n{line}\n")],
        files={path: text},
        skills=SKILLS,
    )


_NORMALISE_SCRIPT = """python3 - <<'PY'
import re
path = {path!r}
pairs = []
for raw in open(path):
    line = raw.strip()
    if not line or line.startswith("#"):
        continue
    key, value = re.split(r"\\s*[{seps}]\\s*", line, maxsplit=1)
    pairs.append((key.strip().lower(), value.strip()))
with open(path, "w") as out:
    for key, value in sorted(pairs):
        out.write(f"{{key}}{sep}{{value}}\\n")
PY"""


def tier3(ctx: GenContext) -> Task:
    """Apply several formatting rules to a settings file."""
    folder, stem, *key_stems = ctx.words(8)
    suffixes = ("dir", "max", "kind", "lead") if ctx.is_test else ("path", "limit", "mode", "owner")
    out_sep = ": " if ctx.is_test else " = "
    in_seps = (":", "=") if ctx.is_test else ("=",)
    path = f"{folder}/{stem}.conf"
    pairs: list[tuple[str, str]] = []
    raw_lines: list[str] = [f"# settings for {stem}"]
    for key_stem in key_stems:
        key = f"{key_stem}_{ctx.choice(suffixes)}"
        value = ctx.choice((str(ctx.rng.randint(1, 900)), ctx.choice(ctx.vocab.places), ctx.choice(ctx.vocab.people)))
        pairs.append((key, value))
        shown_key = ctx.choice((key, key.upper(), key.title()))
        pad = (ctx.choice(("", " ", "  ", "\t")), ctx.choice(("", " ", "   ")), ctx.choice(("", " ", "\t")))
        raw_lines.append(f"{pad[0]}{shown_key}{pad[1]}{ctx.choice(in_seps)}{pad[2]}{value}{ctx.choice(('', ' ', '  '))}")
        if ctx.rng.random() < 0.3:
            raw_lines.append(ctx.choice(("", "   ", f"# {ctx.choice(ctx.vocab.items)} section")))
    expected = lines_text(f"{k}{out_sep}{v}" for k, v in sorted(pairs))
    rules = [
        "remove comment lines (starting with `#`) and blank lines",
        "make every key lowercase (values unchanged)",
        f"write each entry as `key{out_sep}value` with no leading or trailing spaces"
        + (" (the input uses both `:` and `=`)" if ctx.is_test else ""),
        "sort the entries by key",
    ]
    if ctx.is_test:
        rules.reverse()
    rule_text = "; ".join(rules) + "."
    instruction = ctx.say(NORMALISE, path=path, rules=rule_text[0].upper() + rule_text[1:],
                          rules_lower=rule_text)
    script = _NORMALISE_SCRIPT.format(path=path, seps="".join(in_seps), sep=out_sep)
    return ctx.task(
        subtype="normalise",
        instruction=instruction,
        verifier=FileEquals(path, expected),
        gold=[Action.run(f"cat -A {path}"), Action.run(script), Action.run(f"cat {path}")],
        files={path: lines_text(raw_lines)},
        skills=(*SKILLS, "formatting"),
    )


def tier4(ctx: GenContext) -> Task:
    """Replace a term across several files and log how many replacements each file got."""
    folder, log_stem, old, new, *stems = ctx.words(10)
    log = f"{log_stem}.txt"
    files: dict[str, str | bytes] = {}
    counts: dict[str, int] = {}
    changed = set(ctx.sample(stems, ctx.rng.randint(2, 4)))
    for stem in stems:
        mentions = ctx.rng.randint(1, 3) if stem in changed else 0
        body = codename_document(ctx, old, ctx.rng.randint(4, 7), mentions)
        files[f"{folder}/{stem}.md"] = lines_text(body)
        if mentions:
            counts[f"{stem}.md"] = mentions
    # a file with another extension that mentions the term must be left alone
    other = f"{folder}/{stems[0]}.txt"
    files[other] = lines_text(codename_document(ctx, old, 3, 1))
    checks: list[Check] = [FileEquals(p, str(t).replace(old, new) if p.endswith(".md") else str(t))
                           for p, t in files.items()]
    log_text = lines_text(f"{name}: {count}" for name, count in sorted(counts.items()))
    checks.append(FileEquals(f"{folder}/{log}", log_text))
    return ctx.task(
        subtype="multi_file_replace",
        instruction=ctx.say(CHANGELOG, dir=folder, old=old, new=new, log=log),
        verifier=AllOf(checks=tuple(checks)),
        gold=[
            Action.run(f"grep -c '{old}' {folder}/*.md"),
            Action.write(f"{folder}/{log}", log_text),
            Action.run(f"sed -i 's/{old}/{new}/g' {folder}/*.md"),
            Action.run(f"grep -rn '{old}' {folder} || echo none left"),
        ],
        files=files,
        skills=(*SKILLS, "search", "shell"),
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
