"""The ``files`` family: create, rename, move, and organise files by rule."""

from __future__ import annotations

from harnessrl.tasks.builtin.families.common import GenContext, Templates, code_block, lines_text
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, Check, FileAbsent, FileEquals

SKILLS = ("file-ops", "shell")


def filler_lines(ctx: GenContext, count: int) -> list[str]:
    """Returns ``count`` short sentences made of the split's names (file bodies)."""
    v = ctx.vocab
    shapes = (
        "{p} packed the {i} for {c}.",
        "{p} left the {i} in {c}.",
        "The {i} from {c} goes to {p}.",
        "{p} borrowed a {i} on day {n}.",
        "Check the {i} count: {n}.",
    )
    return [
        ctx.choice(shapes).format(
            p=ctx.choice(v.people).title(), i=ctx.choice(v.items), c=ctx.choice(v.places).title(),
            n=ctx.rng.randint(2, 97),
        )
        for _ in range(count)
    ]


CREATE = Templates(
    "files.create",
    train=(
        "Create a file at `{path}` whose content is exactly these lines:\n{body}",
        "Make a new text file `{path}` (create its folder if needed) containing:\n{body}",
        "Write the following lines into a new file named `{path}`:\n{body}",
    ),
    test=(
        "A file `{path}` is needed. Its full content must be the lines below, nothing else:\n{body}",
        "Please add `{path}` to the workspace with this exact text:\n{body}",
        "Produce the file `{path}`; it should hold exactly:\n{body}",
    ),
)

RENAME = Templates(
    "files.rename",
    train=(
        "Rename `{src}` to `{dst}`.",
        "The file `{src}` has the wrong name: it should be called `{dst}`. Fix that.",
        "Please change the name of `{src}` so that it becomes `{dst}`; keep its content.",
    ),
    test=(
        "Give `{src}` the new path `{dst}` (a rename; the content stays the same).",
        "`{src}` must be renamed. Its new name is `{dst}`.",
        "I need `{src}` available as `{dst}` instead, with no copy left under the old name.",
    ),
)

MOVE = Templates(
    "files.move",
    train=(
        "Move every `.{ext}` file from `{src}/` into a new folder `{dst}/`. Leave all other files where they are.",
        "Create the directory `{dst}/` and move all files ending in `.{ext}` from `{src}/` into it; nothing else should move.",
        "The `.{ext}` files in `{src}/` belong in `{dst}/` (which does not exist yet). Move them there and keep the other files in `{src}/`.",
    ),
    test=(
        "Relocate the `.{ext}` files of `{src}/` to `{dst}/`, creating that folder. Files with other extensions must stay put.",
        "Put every `*.{ext}` file currently in `{src}/` into `{dst}/` (make the folder first). Do not touch the rest.",
        "Only the `.{ext}` files should leave `{src}/`: move them into a fresh `{dst}/` directory.",
    ),
)

BY_DATE = Templates(
    "files.by_date",
    train=(
        "The files in `{dir}/` are named `YYYY-MM-DD-<name>.txt`. Move each one to `{dir}/YYYY/MM/<name>.txt` (year and month folders, date prefix dropped from the file name). Example: `{dir}/{example_src}` becomes `{dir}/{example_dst}`.",
        "Organise `{dir}/` by date: a file `YYYY-MM-DD-<name>.txt` must end up as `{dir}/YYYY/MM/<name>.txt`, e.g. `{example_src}` -> `{example_dst}`. No file may remain at the top level of `{dir}/`.",
        "Sort the dated notes in `{dir}/` into `YYYY/MM/` sub-folders of `{dir}/`, renaming `YYYY-MM-DD-<name>.txt` to `<name>.txt` (so `{example_src}` goes to `{example_dst}`).",
    ),
    test=(
        "Every file in `{dir}/` follows the pattern `YYYY-MM-DD-<name>.txt`. Restructure the folder so each file lives at `{dir}/YYYY/MM/<name>.txt`; for instance `{example_src}` turns into `{example_dst}`.",
        "Files under `{dir}/` carry a date prefix. File them into year/month folders inside `{dir}/` and strip the prefix: `{example_src}` -> `{example_dst}`, and likewise for the rest.",
        "Please archive `{dir}/` chronologically: `<YYYY>-<MM>-<DD>-<name>.txt` moves to `{dir}/<YYYY>/<MM>/<name>.txt` (example: `{example_src}` to `{example_dst}`).",
    ),
)

ARCHIVE = Templates(
    "files.archive_by_header",
    train=(
        "Each note in `{dir}/` starts with a header line `{key}: <value>`. Move every note whose {key} is `{value}` into `{dir}/{sub}/` (create it), leave the others in place, and write `{dir}/{sub}/{index}` listing the moved file names (names only, no folders) in alphabetical order, one per line.",
        "Archive the `{value}` notes: look at the `{key}:` header line of each file in `{dir}/`, move those with `{key}: {value}` to a new folder `{dir}/{sub}/`, then create `{dir}/{sub}/{index}` with the names of the moved files, sorted alphabetically, one per line.",
        "In `{dir}/`, the files whose first line reads `{key}: {value}` must go into `{dir}/{sub}/`. Afterwards add an index file `{dir}/{sub}/{index}` that lists just the file names you moved, sorted A-Z, one per line. Other notes stay where they are.",
    ),
    test=(
        "Notes in `{dir}/` declare their {key} on the first line (`{key}: ...`). Those marked `{value}` belong in `{dir}/{sub}/`; move them (make the folder) and record their bare file names, alphabetically and one per line, in `{dir}/{sub}/{index}`.",
        "Clean up `{dir}/`: any file with the header `{key}: {value}` goes to `{dir}/{sub}/`. Finish by writing `{dir}/{sub}/{index}`: the sorted list of moved file names (without directory), one name per line.",
        "Find the files in `{dir}/` whose `{key}:` header says `{value}` and move them into `{dir}/{sub}/`. Then list their names (file name only, alphabetical order, one per line) in `{dir}/{sub}/{index}`. Leave the remaining notes alone.",
    ),
)


def tier1(ctx: GenContext) -> Task:
    """One action: create a file with given content, or rename a file."""
    if ctx.rng.random() < 0.5:
        folder, stem = ctx.words(2)
        path = f"{folder}/{stem}.txt"
        body = filler_lines(ctx, ctx.rng.randint(2, 3))
        text = lines_text(body)
        return ctx.task(
            subtype="create",
            instruction=ctx.say(CREATE, path=path, body=code_block(text)),
            verifier=FileEquals(path, text),
            gold=[Action.write(path, text)],
            skills=SKILLS,
        )
    folder, *stems = ctx.words(5)
    ext = ctx.choice(("txt", "md", "log"))
    files = {f"{folder}/{s}.{ext}": lines_text(filler_lines(ctx, 2)) for s in stems[:3]}
    src = f"{folder}/{stems[0]}.{ext}"
    dst = f"{folder}/{stems[3]}.{ext}"
    checks: list[Check] = [FileEquals(dst, files[src]), FileAbsent(src)]
    checks += [FileEquals(p, t) for p, t in files.items() if p != src]
    return ctx.task(
        subtype="rename",
        instruction=ctx.say(RENAME, src=src, dst=dst),
        verifier=AllOf(checks=tuple(checks)),
        gold=[Action.run(f"mv {src} {dst}")],
        files=files,
        skills=SKILLS,
    )


def tier2(ctx: GenContext) -> Task:
    """Two actions: make a folder and move the files of one extension into it."""
    src, dst, *stems = ctx.words(9)
    exts = ctx.sample(("csv", "txt", "log", "md", "json"), 3)
    ext = exts[0]
    moved_count = ctx.rng.randint(2, 3)
    files: dict[str, str | bytes] = {}
    for n, stem in enumerate(stems):
        file_ext = ext if n < moved_count else ctx.choice(exts[1:])
        files[f"{src}/{stem}.{file_ext}"] = lines_text(filler_lines(ctx, 2))
    checks: list[Check] = []
    for path, text in files.items():
        name = path.split("/")[-1]
        if path.endswith(f".{ext}"):
            checks += [FileEquals(f"{dst}/{name}", str(text)), FileAbsent(path)]
        else:
            checks.append(FileEquals(path, str(text)))
    return ctx.task(
        subtype="move",
        instruction=ctx.say(MOVE, src=src, dst=dst, ext=ext),
        verifier=AllOf(checks=tuple(checks)),
        gold=[Action.run(f"ls {src}"), Action.run(f"mkdir -p {dst} && mv {src}/*.{ext} {dst}/")],
        files=files,
        skills=SKILLS,
    )


_BY_DATE_SCRIPT = """cd {dir} && for f in ????-??-??-*.txt; do
  y=$(echo "$f" | cut -c1-4); m=$(echo "$f" | cut -c6-7); name=$(echo "$f" | cut -c12-)
  mkdir -p "$y/$m" && mv "$f" "$y/$m/$name"
done"""


def tier3(ctx: GenContext) -> Task:
    """Organise files into year/month folders by the date in their names."""
    folder, *stems = ctx.words(8)
    files: dict[str, str | bytes] = {}
    targets: dict[str, str] = {}
    for stem in stems:
        year = ctx.choice(ctx.vocab.years)
        month, day = ctx.rng.randint(1, 12), ctx.rng.randint(1, 28)
        name = f"{year}-{month:02d}-{day:02d}-{stem}.txt"
        files[f"{folder}/{name}"] = lines_text(filler_lines(ctx, 2))
        targets[f"{folder}/{name}"] = f"{folder}/{year}/{month:02d}/{stem}.txt"
    example_src = next(iter(targets))
    checks: list[Check] = []
    for src, dst in targets.items():
        checks += [FileEquals(dst, str(files[src])), FileAbsent(src)]
    instruction = ctx.say(
        BY_DATE, dir=folder, example_src=example_src.split("/", 1)[1],
        example_dst=targets[example_src].split("/", 1)[1],
    )
    return ctx.task(
        subtype="by_date",
        instruction=instruction,
        verifier=AllOf(checks=tuple(checks)),
        gold=[Action.run(f"ls {folder}"), Action.run(_BY_DATE_SCRIPT.format(dir=folder)),
              Action.run(f"find {folder} -type f | sort")],
        files=files,
        skills=(*SKILLS, "rules"),
    )


def tier4(ctx: GenContext) -> Task:
    """Move notes by a header value, then write an index of what moved."""
    folder, sub, index_stem, *stems = ctx.words(12)
    key = "state" if ctx.is_test else "status"
    ext = "txt" if ctx.is_test else "md"
    statuses = ctx.vocab.statuses
    value = statuses[1]
    index = f"{index_stem}.txt"
    files: dict[str, str | bytes] = {}
    moved: list[str] = []
    for n, stem in enumerate(stems):
        status = value if n < 3 else ctx.choice([s for s in statuses if s != value])
        if n >= 3 and ctx.rng.random() < 0.3:
            status = value
        # a decoy: the matching word appears in the body of notes that must stay
        body = filler_lines(ctx, 2)
        if status != value and ctx.rng.random() < 0.5:
            body.append(f"previously {value}, reopened by {ctx.choice(ctx.vocab.people).title()}")
        name = f"{stem}.{ext}"
        files[f"{folder}/{name}"] = lines_text([f"{key}: {status}", *body])
        if status == value:
            moved.append(name)
    moved.sort()
    checks: list[Check] = []
    for path, text in files.items():
        name = path.split("/")[-1]
        if name in moved:
            checks += [FileEquals(f"{folder}/{sub}/{name}", str(text)), FileAbsent(path)]
        else:
            checks.append(FileEquals(path, str(text)))
    index_text = lines_text(moved)
    checks.append(FileEquals(f"{folder}/{sub}/{index}", index_text))
    move = (
        f"mkdir -p {folder}/{sub} && for f in $(grep -l '^{key}: {value}$' {folder}/*.{ext}); "
        f"do mv \"$f\" {folder}/{sub}/; done"
    )
    return ctx.task(
        subtype="archive_by_header",
        instruction=ctx.say(ARCHIVE, dir=folder, sub=sub, index=index, key=key, value=value),
        verifier=AllOf(checks=tuple(checks)),
        gold=[
            Action.run(f"head -n 1 {folder}/*.{ext}"),
            Action.run(f"grep -l '^{key}: {value}$' {folder}/*.{ext}"),
            Action.run(move),
            Action.write(f"{folder}/{sub}/{index}", index_text),
            Action.run(f"ls {folder} {folder}/{sub}"),
        ],
        files=files,
        skills=(*SKILLS, "rules", "search"),
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
