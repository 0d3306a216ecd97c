"""The ``search`` family: find files by content or size, count them, and report what was found."""

from __future__ import annotations

from harnessrl.tasks.builtin.families.common import (
    GenContext,
    Templates,
    lines_text,
    number_answer,
    path_answer,
)
from harnessrl.tasks.builtin.families.files import filler_lines
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, AnswerEquals, FileEquals

SKILLS = ("search", "shell")


def make_tree(ctx: GenContext, subdirs: int, per_dir: int, exts: tuple[str, ...]) -> tuple[str, dict[str, list[str]]]:
    """Returns (root folder, {path: lines}) for a small nested tree of filler files."""
    names = ctx.words(1 + subdirs + subdirs * per_dir)
    root, dirs, stems = names[0], names[1 : 1 + subdirs], names[1 + subdirs :]
    tree: dict[str, list[str]] = {}
    for n, stem in enumerate(stems):
        folder = dirs[n % subdirs]
        tree[f"{root}/{folder}/{stem}.{ctx.choice(exts)}"] = filler_lines(ctx, ctx.rng.randint(3, 8))
    return root, tree


def as_files(tree: dict[str, list[str]]) -> dict[str, str | bytes]:
    """Returns the tree as ``TaskSetup.files``."""
    return {path: lines_text(lines) for path, lines in tree.items()}


def put_line(ctx: GenContext, lines: list[str], line: str) -> None:
    """Inserts ``line`` at a random position of ``lines``."""
    lines.insert(ctx.rng.randint(0, len(lines)), line)


FIND_CODE = Templates(
    "search.find_code",
    train=(
        "One file somewhere under `{root}/` mentions the incident code `{code}`. Submit that file's path relative to the workspace root (for example `{root}/x/y.log`).",
        "Which file in the `{root}/` tree contains `{code}`? Submit its relative path, like `{root}/dir/file.txt`.",
        "Search `{root}/` for the string `{code}` and submit the path of the file that contains it (relative to the current directory).",
    ),
    test=(
        "Locate the file under `{root}/` whose text includes `{code}`; your answer is its path from the workspace root (e.g. `{root}/a/b.txt`).",
        "Exactly one file below `{root}/` refers to `{code}`. Submit where it is, as a relative path such as `{root}/folder/name.ext`.",
        "I lost track of the note about `{code}`. It is somewhere in `{root}/`. Submit the relative path of that file.",
    ),
)

FIND_CODES = Templates(
    "search.find_codes",
    train=(
        "Several files under `{root}/` mention the incident code `{code}`. Submit their paths relative to the workspace root, one per line (for example `{root}/x/y.log`).",
        "Which files in the `{root}/` tree contain `{code}`? Submit every such relative path on a line of its own.",
        "Search `{root}/` for the string `{code}` and submit the paths of all files that contain it, one path per line.",
    ),
    test=(
        "Locate each file under `{root}/` whose text includes `{code}`; your answer lists their paths from the workspace root, one per line.",
        "More than one file below `{root}/` refers to `{code}`. Submit where they are, one relative path per line.",
        "The notes about `{code}` are spread over a few files in `{root}/`. Submit the relative path of each, one per line.",
    ),
)

COUNT_FILES = Templates(
    "search.count_files",
    train=(
        "How many `.txt` files under `{root}/` (including subfolders) contain the word `{word}`? Submit the number.",
        "Count the `.txt` files anywhere in `{root}/` that mention `{word}`; submit only the count.",
        "Submit the number of files with the extension `.txt` in the `{root}/` tree whose content includes `{word}`.",
    ),
    test=(
        "Among all `*.txt` files below `{root}/`, in how many does `{word}` appear? Answer with the number.",
        "Report how many `.txt` documents inside `{root}/` (any depth) reference `{word}`. Other extensions do not count.",
        "Find the `.txt` files in `{root}/` and its subdirectories that contain `{word}`, and submit how many there are.",
    ),
)

MARKER_REPORT = Templates(
    "search.marker_report",
    train=(
        "Find every file under `{root}/` that contains `{marker}` (uppercase, exact). Write `{report}` with one line per such file in the form `<path>:<number of lines containing {marker}>`, paths relative to the workspace root, sorted by path.",
        "Make a report of the `{marker}` markers in `{root}/`: for each file with at least one line containing `{marker}`, write `<path>:<count of such lines>` to `{report}` (relative paths, sorted). Lowercase variants do not count.",
        "Write `{report}`: list the files in the `{root}/` tree that contain the exact text `{marker}`, each as `<relative path>:<number of matching lines>`, in sorted order of path.",
    ),
    test=(
        "Produce `{report}` summarising where `{marker}` (case-sensitive) occurs below `{root}/`: one line `<path>:<lines with {marker}>` per file that has any, paths relative to the workspace, ordered by path.",
        "Scan `{root}/` for lines containing `{marker}`. In `{report}`, put `<file path>:<how many such lines>` for every file with a match, sorted by file path (relative to here).",
        "Which files under `{root}/` still have `{marker}` lines, and how many? Write the answer to `{report}` as sorted lines `<relative path>:<count>`; ignore files with none and ignore other capitalisations.",
    ),
)

LARGEST = Templates(
    "search.largest_files",
    train=(
        "Find the three largest files (by size in bytes) under `{root}/`. Write their paths (relative to the workspace root) to `{report}`, one per line, largest first. Then submit the total number of lines in those three files.",
        "Write to `{report}` the relative paths of the 3 biggest files in `{root}/` (byte size, descending, one per line), and submit how many lines the three files have together.",
        "Which three files in the `{root}/` tree are the largest in bytes? List them in `{report}` from largest to smallest (relative paths, one per line) and submit their combined line count.",
    ),
    test=(
        "Identify the top 3 files under `{root}/` by byte size. Save their paths from the workspace root in `{report}`, biggest first, one per line; then submit the sum of their line counts.",
        "`{report}` should name the three heaviest files (most bytes) in `{root}/`, largest first, one relative path per line. Your submitted answer: the total number of lines of those files.",
        "Rank the files in `{root}/` by size in bytes; write the three largest (relative paths, descending, one per line) into `{report}` and answer with their total number of lines.",
    ),
)


def tier1(ctx: GenContext) -> Task:
    """Find the one file that contains a code and answer with its path; at odd indices, find
    the few files that contain it and answer with their paths, one per line (a multi-line
    answer every tool interface must be able to submit)."""
    root, tree = make_tree(ctx, 3, 3, ("log", "txt", "md"))
    if ctx.index % 2:
        return _find_codes(ctx, root, tree)
    prefix = ctx.vocab.code_prefix
    numbers = ctx.sample(range(1000, 9999), len(tree))
    paths = list(tree)
    for path, number in zip(paths, numbers, strict=True):
        put_line(ctx, tree[path], f"{prefix}-{number} reported by {ctx.choice(ctx.vocab.people)}")
    target = ctx.choice(paths)
    code = f"{prefix}-{numbers[paths.index(target)]}"
    return ctx.task(
        subtype="find_code",
        instruction=ctx.say(FIND_CODE, root=root, code=code),
        verifier=path_answer(target),
        gold=[Action.run(f"grep -rl '{code}' {root}"), Action.submit(target)],
        files=as_files(tree),
        skills=SKILLS,
        expects_answer=True,
    )


def _find_codes(ctx: GenContext, root: str, tree: dict[str, list[str]]) -> Task:
    code = f"{ctx.vocab.code_prefix}-{ctx.rng.randint(1000, 9999)}"
    targets = sorted(ctx.sample(list(tree), ctx.rng.randint(2, 3)))
    for path in targets:
        put_line(ctx, tree[path], f"{code} reported by {ctx.choice(ctx.vocab.people)}")
    return ctx.task(
        subtype="find_codes",
        instruction=ctx.say(FIND_CODES, root=root, code=code),
        verifier=AnswerEquals("\n".join(targets), mode="lines"),
        gold=[Action.run(f"grep -rl '{code}' {root} | sort"), Action.submit("\n".join(targets))],
        files=as_files(tree),
        skills=SKILLS,
        expects_answer=True,
    )


def tier2(ctx: GenContext) -> Task:
    """Count files of one extension that contain a word."""
    root, tree = make_tree(ctx, 3, 4, ("txt", "txt", "md", "log"))
    while not any(p.endswith(".txt") for p in tree):
        root, tree = make_tree(ctx, 3, 4, ("txt", "txt", "md", "log"))
    word = ctx.choice([w for w in ctx.vocab.words if not any(w in p for p in tree)])
    mentioned = [p for p in tree if ctx.rng.random() < 0.5]
    if not any(p.endswith(".txt") for p in mentioned):
        mentioned.append(ctx.choice([p for p in tree if p.endswith(".txt")]))
    for path in mentioned:
        put_line(ctx, tree[path], ctx.choice((f"See also the {word} notes.", f"The {word} list moved.")))
    count = sum(p.endswith(".txt") for p in mentioned)
    return ctx.task(
        subtype="count_files",
        instruction=ctx.say(COUNT_FILES, root=root, word=word),
        verifier=number_answer(count),
        gold=[Action.run(f"grep -rl --include='*.txt' '{word}' {root}"),
              Action.run(f"grep -rl --include='*.txt' '{word}' {root} | wc -l"),
              Action.submit(str(count))],
        files=as_files(tree),
        skills=SKILLS,
        expects_answer=True,
    )


def tier3(ctx: GenContext) -> Task:
    """Count marker lines per file and write a sorted report."""
    root, tree = make_tree(ctx, 3, 3, ("py", "md", "txt"))
    marker = ctx.vocab.marker
    report = f"{ctx.choice([w for w in ctx.vocab.words if w not in root])}_report.txt"
    counts: dict[str, int] = {}
    for path, lines in tree.items():
        roll = ctx.rng.random()
        if roll < 0.6:
            hits = ctx.rng.randint(1, 3)
            for _ in range(hits):
                put_line(ctx, lines, f"{marker}: ask {ctx.choice(ctx.vocab.people).title()} about the {ctx.choice(ctx.vocab.items)}")
            counts[path] = hits
        elif roll < 0.8:  # a decoy in lowercase must not count
            put_line(ctx, lines, f"nothing {marker.lower()} here")
    if not counts:
        path = next(iter(tree))
        put_line(ctx, tree[path], f"{marker}: check this")
        counts[path] = 1
    expected = lines_text(f"{p}:{c}" for p, c in sorted(counts.items()))
    return ctx.task(
        subtype="marker_report",
        instruction=ctx.say(MARKER_REPORT, root=root, marker=marker, report=report),
        verifier=FileEquals(report, expected),
        gold=[Action.run(f"grep -rn '{marker}' {root}"),
              Action.run(f"grep -rc '{marker}' {root} | grep -v ':0$' | LC_ALL=C sort > {report}"),
              Action.run(f"cat {report}")],
        files=as_files(tree),
        skills=(*SKILLS, "report"),
    )


def tier4(ctx: GenContext) -> Task:
    """Rank files by size, report the top three, and answer with their total line count."""
    while True:
        root, tree = make_tree(ctx, 3, 3, ("log", "txt", "csv"))
        for lines in tree.values():
            lines.extend(filler_lines(ctx, ctx.rng.randint(0, 6)))
        files = as_files(tree)
        sizes = sorted(((len(str(t).encode()), p) for p, t in files.items()), reverse=True)
        if sizes[2][0] > sizes[3][0] and sizes[0][0] > sizes[1][0] > sizes[2][0]:
            break
    top = [p for _, p in sizes[:3]]
    total_lines = sum(len(tree[p]) for p in top)
    report = f"{ctx.choice([w for w in ctx.vocab.words if w not in root])}_largest.txt"
    report_text = lines_text(top)
    return ctx.task(
        subtype="largest_files",
        instruction=ctx.say(LARGEST, root=root, report=report),
        verifier=AllOf(checks=(FileEquals(report, report_text), number_answer(total_lines))),
        gold=[
            Action.run(f"find {root} -type f -exec wc -c {{}} + | sort -rn | head -n 5"),
            Action.write(report, report_text),
            Action.run(f"wc -l {' '.join(top)}"),
            Action.submit(str(total_lines)),
        ],
        files=files,
        skills=(*SKILLS, "metadata", "report"),
        expects_answer=True,
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
