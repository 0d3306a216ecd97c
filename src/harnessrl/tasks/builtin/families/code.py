"""The ``code`` family: make given tests pass by fixing or implementing functions (SWE-Gym-like).

The test file is laid into the starting workspace (so the agent can read and run it) and
again as a protected file after the episode, so editing the tests cannot pass a task. Tests
are plain ``assert`` functions, runnable with pytest or the verifier's built-in runner.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from harnessrl.tasks.builtin.families.common import GenContext, Templates
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import PytestPasses

SKILLS = ("code", "python", "testing")


@dataclass(frozen=True)
class FunctionSpec:
    """A small function: its correct source, bugs that break it, and a test-case generator.

    ``bugs`` are (correct fragment, buggy fragment) pairs; each fragment occurs once in
    ``source``. ``cases`` draws argument tuples; ``sentinels`` are argument tuples that
    always expose the bugs.
    """

    name: str
    source: str
    bugs: tuple[tuple[str, str], ...]
    cases: Callable[[random.Random], list[tuple[Any, ...]]]
    sentinels: tuple[tuple[Any, ...], ...]

    def signature_and_doc(self) -> str:
        """Returns the ``def`` line and docstring, the body replaced by a stub."""
        lines = self.source.splitlines()
        head: list[str] = []
        for line in lines:
            head.append(line)
            if len(head) > 1 and line.strip().endswith('"""'):
                break
        return "\n".join([*head, "    raise NotImplementedError"]) + "\n"


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 40) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _word(rng: random.Random, letters: str = "abcdeiou", lo: int = 2, hi: int = 7) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(lo, hi)))


TRAIN_SPECS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        "clamp",
        'def clamp(value, low, high):\n    """Returns value limited to the range [low, high]."""\n'
        "    return max(low, min(value, high))\n",
        (("max(low, min(value, high))", "min(low, max(value, high))"),),
        lambda r: [(r.randint(-50, 50), r.randint(-20, 0), r.randint(1, 20)) for _ in range(3)],
        ((-30, -5, 5), (30, -5, 5), (2, -5, 5)),
    ),
    FunctionSpec(
        "running_total",
        'def running_total(numbers):\n    """Returns the list of prefix sums of numbers."""\n'
        "    total = 0\n    out = []\n    for number in numbers:\n        total += number\n"
        "        out.append(total)\n    return out\n",
        (("total += number", "total = number"),),
        lambda r: [(_ints(r, r.randint(2, 6)),) for _ in range(2)],
        (([1, 2, 3],),),
    ),
    FunctionSpec(
        "count_vowels",
        'def count_vowels(text):\n    """Returns how many vowels (a, e, i, o, u; any case) text contains."""\n'
        '    return sum(1 for ch in text.lower() if ch in "aeiou")\n',
        (("text.lower()", "text"),),
        lambda r: [(_word(r, "abcdeiouAEIOUxyz ", 3, 12),) for _ in range(3)],
        (("AEIOU and more",),),
    ),
    FunctionSpec(
        "chunk",
        'def chunk(items, size):\n    """Returns items split into consecutive lists of length size (the last may be shorter)."""\n'
        "    return [items[i:i + size] for i in range(0, len(items), size)]\n",
        (("items[i:i + size]", "items[i:i + size - 1]"),),
        lambda r: [(_ints(r, r.randint(3, 9)), r.randint(2, 4)) for _ in range(2)],
        (([1, 2, 3, 4, 5], 2),),
    ),
    FunctionSpec(
        "is_palindrome",
        'def is_palindrome(text):\n    """Returns True when text reads the same backwards, ignoring case and non-alphanumerics."""\n'
        "    cleaned = [ch.lower() for ch in text if ch.isalnum()]\n    return cleaned == cleaned[::-1]\n",
        (("ch.lower() for ch", "ch for ch"),),
        lambda r: [(r.choice(["Never odd or even", "step on no pets", "abcba", "abca", "A man, a plan"]),)
                   for _ in range(2)],
        (("Was it a car or a cat I saw",), ("banana",)),
    ),
    FunctionSpec(
        "median",
        'def median(numbers):\n    """Returns the median of a non-empty list of numbers."""\n'
        "    ordered = sorted(numbers)\n    mid = len(ordered) // 2\n    if len(ordered) % 2:\n"
        "        return ordered[mid]\n    return (ordered[mid - 1] + ordered[mid]) / 2\n",
        (("ordered = sorted(numbers)", "ordered = list(numbers)"),),
        lambda r: [(_ints(r, r.randint(3, 7)),) for _ in range(2)],
        (([9, 1, 5],), ([4, 8, 2, 6],)),
    ),
    FunctionSpec(
        "dedupe",
        'def dedupe(items):\n    """Returns items without repeats, keeping the first occurrence of each in order."""\n'
        "    seen = set()\n    out = []\n    for item in items:\n        if item not in seen:\n"
        "            seen.add(item)\n            out.append(item)\n    return out\n",
        (("seen.add(item)", "seen.discard(item)"),),
        lambda r: [(_ints(r, r.randint(4, 9), 0, 5),) for _ in range(2)],
        (([3, 1, 3, 2, 1],),),
    ),
    FunctionSpec(
        "title_case",
        'def title_case(text):\n    """Returns text with each word capitalised and the rest of the word lowercase."""\n'
        '    return " ".join(w[:1].upper() + w[1:].lower() for w in text.split())\n',
        (("w[1:].lower()", "w[1:]"),),
        lambda r: [(" ".join(_word(r, "abcdeXYZ") for _ in range(3)),) for _ in range(2)],
        (("hELLO wORLD",),),
    ),
    FunctionSpec(
        "word_counts",
        'def word_counts(text):\n    """Returns a dict mapping each lowercased word of text to its number of occurrences."""\n'
        "    counts = {}\n    for word in text.lower().split():\n"
        "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
        (("counts.get(word, 0) + 1", "counts.get(word, 1)"),),
        lambda r: [(" ".join(r.choice(["ab", "cd", "Ab", "ef"]) for _ in range(r.randint(3, 7))),)
                   for _ in range(2)],
        (("to be or not to be",),),
    ),
    FunctionSpec(
        "fizzbuzz",
        'def fizzbuzz(n):\n    """Returns "FizzBuzz", "Fizz", "Buzz" or str(n) for the number n."""\n'
        '    if n % 15 == 0:\n        return "FizzBuzz"\n    if n % 3 == 0:\n        return "Fizz"\n'
        '    if n % 5 == 0:\n        return "Buzz"\n    return str(n)\n',
        (("return str(n)", "return n"),),
        lambda r: [(r.randint(1, 100),) for _ in range(3)],
        ((7,), (15,), (9,)),
    ),
    FunctionSpec(
        "mean",
        'def mean(numbers):\n    """Returns the arithmetic mean of numbers, or 0.0 for an empty list."""\n'
        "    return sum(numbers) / len(numbers) if numbers else 0.0\n",
        (("sum(numbers) / len(numbers)", "sum(numbers) / (len(numbers) + 1)"),),
        lambda r: [(_ints(r, r.randint(2, 6)),) for _ in range(2)],
        (([2, 4, 6],), ([],)),
    ),
    FunctionSpec(
        "caesar",
        'def caesar(text, shift):\n    """Returns text with each lowercase letter shifted by shift places (wrapping z to a)."""\n'
        "    out = []\n    for ch in text:\n        if \"a\" <= ch <= \"z\":\n"
        "            out.append(chr((ord(ch) - ord(\"a\") + shift) % 26 + ord(\"a\")))\n"
        "        else:\n            out.append(ch)\n    return \"\".join(out)\n",
        (("% 26", "% 25"),),
        lambda r: [(_word(r, "abcxyz -", 3, 9), r.randint(1, 25)) for _ in range(2)],
        (("xyz", 3),),
    ),
)

TEST_SPECS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        "second_largest",
        'def second_largest(numbers):\n    """Returns the second largest distinct value of numbers, or None if there is none."""\n'
        "    distinct = sorted(set(numbers))\n    return distinct[-2] if len(distinct) > 1 else None\n",
        (("sorted(set(numbers))", "sorted(numbers)"),),
        lambda r: [(_ints(r, r.randint(3, 7)),) for _ in range(2)],
        (([5, 9, 9, 1],), ([4, 4],)),
    ),
    FunctionSpec(
        "rle_encode",
        'def rle_encode(text):\n    """Returns the run-length encoding of text, e.g. "aaab" -> "a3b1"."""\n'
        "    out = []\n    i = 0\n    while i < len(text):\n        j = i\n"
        "        while j < len(text) and text[j] == text[i]:\n            j += 1\n"
        '        out.append(f"{text[i]}{j - i}")\n        i = j\n    return "".join(out)\n',
        (("{j - i}", "{j - i - 1}"),),
        lambda r: [("".join(r.choice("pq") * r.randint(1, 3) for _ in range(r.randint(2, 4))),)
                   for _ in range(2)],
        (("ppqqq",),),
    ),
    FunctionSpec(
        "normalize_spaces",
        'def normalize_spaces(text):\n    """Returns text with runs of whitespace collapsed to one space and no leading/trailing space."""\n'
        '    return " ".join(text.split())\n',
        (("text.split()", 'text.split(" ")'),),
        lambda r: [(r.choice(["  lorem   ipsum ", "a\tb  c", "one two", " x  y  z "]),) for _ in range(2)],
        (("alpha   beta",),),
    ),
    FunctionSpec(
        "digit_sum",
        'def digit_sum(number):\n    """Returns the sum of the decimal digits of an integer (the sign is ignored)."""\n'
        "    return sum(int(d) for d in str(abs(number)))\n",
        (("str(abs(number))", "str(number)"),),
        lambda r: [(r.randint(-9999, 9999),) for _ in range(3)],
        ((-482,), (907,)),
    ),
    FunctionSpec(
        "rotate_left",
        'def rotate_left(items, steps):\n    """Returns items rotated left by steps positions (steps may exceed the length)."""\n'
        "    if not items:\n        return []\n    steps %= len(items)\n    return items[steps:] + items[:steps]\n",
        (("items[steps:] + items[:steps]", "items[:steps] + items[steps:]"),),
        lambda r: [(_ints(r, r.randint(2, 6)), r.randint(0, 9)) for _ in range(2)],
        (([1, 2, 3, 4], 1), ([], 3)),
    ),
    FunctionSpec(
        "percent_change",
        'def percent_change(old, new):\n    """Returns the change from old to new in percent of old, rounded to 1 decimal."""\n'
        "    return round((new - old) / old * 100, 1)\n",
        (("(new - old) / old", "(new - old) / new"),),
        lambda r: [(r.randint(10, 400), r.randint(10, 400)) for _ in range(2)],
        ((50, 75), (200, 150)),
    ),
    FunctionSpec(
        "interleave",
        'def interleave(first, second):\n    """Returns the items of first and second alternately; leftovers of the longer list go last."""\n'
        "    out = []\n    for i in range(max(len(first), len(second))):\n        if i < len(first):\n"
        "            out.append(first[i])\n        if i < len(second):\n            out.append(second[i])\n"
        "    return out\n",
        (("max(len(first), len(second))", "min(len(first), len(second))"),),
        lambda r: [(_ints(r, r.randint(1, 4)), _ints(r, r.randint(1, 4))) for _ in range(2)],
        (([1, 2, 3], [7]),),
    ),
    FunctionSpec(
        "acronym",
        'def acronym(phrase):\n    """Returns the uppercase first letters of the words of phrase (hyphens split words too)."""\n'
        '    return "".join(word[0].upper() for word in phrase.replace("-", " ").split())\n',
        (('phrase.replace("-", " ").split()', "phrase.split()"),),
        lambda r: [(r.choice(["portable network graphics", "as soon as possible", "light-emitting diode"]),)
                   for _ in range(2)],
        (("read-only memory",),),
    ),
)

SPECS: dict[str, tuple[FunctionSpec, ...]] = {"train": TRAIN_SPECS, "test": TEST_SPECS}


@cache
def _compiled(source: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<spec>", "exec"), namespace)  # trusted suite code, not model output
    return next(v for k, v in namespace.items() if callable(v) and not k.startswith("__"))


def _outcome(source: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, _compiled(source)(*args)
    except Exception as exc:  # a buggy version may crash; that exposes the bug too
        return False, type(exc).__name__


def make_cases(ctx: GenContext, spec: FunctionSpec, buggy: str | None) -> list[tuple[tuple[Any, ...], Any]]:
    """Returns (args, expected) pairs from the correct source; at least one exposes ``buggy``."""
    cases = spec.cases(ctx.rng)
    cases.append(ctx.choice(spec.sentinels))
    if buggy is not None and all(_outcome(buggy, a) == _outcome(spec.source, a) for a in cases):
        cases.extend(spec.sentinels)
    unique: list[tuple[Any, ...]] = []
    for args in cases:
        if args not in unique:
            unique.append(args)
    return [(args, _compiled(spec.source)(*args)) for args in unique]


def render_tests(imports: list[tuple[str, str]], cases: dict[str, list[tuple[tuple[Any, ...], Any]]]) -> str:
    """Returns a test module: ``from module import name`` lines and one test per case."""
    lines = [f"from {module} import {name}" for module, name in imports]
    for name, pairs in cases.items():
        for n, (args, expected) in enumerate(pairs):
            call = f"{name}({', '.join(repr(a) for a in args)})"
            lines += ["", "", f"def test_{name}_{n}():", f"    assert {call} == {expected!r}"]
    return "\n".join(lines) + "\n"


def break_source(spec: FunctionSpec) -> tuple[str, str, str]:
    """Returns (buggy source, correct line, buggy line) for the spec's first bug.

    Whole lines are returned so that a gold ``edit_file`` matches exactly one place.
    """
    good, bad = spec.bugs[0]
    line = next(line for line in spec.source.splitlines() if good in line)
    broken_line = line.replace(good, bad)
    return spec.source.replace(line, broken_line), line, broken_line


def _checked_edit(path: str, source: str, bad_line: str, good_line: str) -> Action:
    if source.count(bad_line) != 1:
        raise AssertionError(f"bug line {bad_line!r} is not unique in {path}")
    return Action.edit(path, bad_line, good_line)


FIX_ONE = Templates(
    "code.fix_one",
    train=(
        "The tests in `{tests}` fail. Fix the bug in `{module_path}` so that they pass. Do not modify the tests.",
        "`{module_path}` has a bug that makes `{tests}` fail. Find it and fix it (the test file must stay unchanged).",
        "Make `python3 -m pytest {tests}` pass by correcting the implementation in `{module_path}`; leave the tests as they are.",
    ),
    test=(
        "Something in `{module_path}` is wrong: `{tests}` does not pass. Repair the code, not the tests.",
        "Debug `{module_path}`. Success means every test in `{tests}` passes without editing that file.",
        "A regression broke `{tests}`. The fault is in `{module_path}`; fix it so the whole test file passes.",
    ),
)

IMPLEMENT = Templates(
    "code.implement",
    train=(
        "Implement `{name}` in `{module_path}` (it currently raises NotImplementedError) so that `{tests}` passes. Do not edit the tests.",
        "`{module_path}` contains a stub for `{name}`. Write its body according to the docstring; `{tests}` must pass.",
        "Fill in the function `{name}` in `{module_path}`. The expected behaviour is in its docstring and in `{tests}`, which you must not change.",
    ),
    test=(
        "Complete the unimplemented `{name}` of `{module_path}`; the tests in `{tests}` define what it must do and have to pass unchanged.",
        "Provide a working `{name}` in `{module_path}` in place of the `NotImplementedError` stub, so `{tests}` succeeds.",
        "Your job: write the code of `{name}` (file `{module_path}`) so that all of `{tests}` passes. Keep the test file as it is.",
    ),
)

FIX_TWO = Templates(
    "code.fix_two",
    train=(
        "`{tests}` has failing tests for `{names}` in `{module_path}`. Fix the bugs in that module so the whole test file passes; do not change the tests.",
        "There are bugs in more than one function of `{module_path}` (`{names}`). Get `{tests}` passing by fixing the code only.",
        "Run `{tests}`, find out why `{names}` in `{module_path}` misbehave, and fix them. The test file must not be modified.",
    ),
    test=(
        "Several functions in `{module_path}` (`{names}`) are broken, as `{tests}` shows. Repair them until every test passes, leaving the tests alone.",
        "Make all of `{tests}` pass. The failures come from `{names}` in `{module_path}`; change only that module.",
        "The module `{module_path}` ships with bugs in `{names}`. Fix the implementation so `{tests}` is green (no edits to the test file).",
    ),
)

PACKAGE = Templates(
    "code.package",
    train=(
        "The package `{package}/` is unfinished: `{stub}` is not implemented yet and other functions have bugs. Make `{tests}` pass by changing only files in `{package}/`.",
        "Get `{tests}` passing. You will need to implement `{stub}` and fix whatever else in `{package}/` is broken; do not edit the tests.",
        "`{tests}` exercises the package `{package}/`. Implement the missing function `{stub}` and fix the failing ones so the full test file passes (tests unchanged).",
    ),
    test=(
        "Finish the package `{package}/`: write `{stub}` (currently a stub) and repair the buggy functions so every test in `{tests}` passes. Only package files may change.",
        "`{tests}` fails for several reasons inside `{package}/`, including an unimplemented `{stub}`. Fix all of them without touching the test file.",
        "Bring `{package}/` to a state where `{tests}` passes: one function (`{stub}`) still needs writing, and some others are wrong.",
    ),
)


def _test_command(tests: str) -> str:
    """Returns a command running every ``test_*`` function of ``tests`` (pytest not needed)."""
    runner = (
        f"import runpy, sys; sys.path.insert(0, '.'); ns = runpy.run_path('{tests}'); "
        "[fn() for name, fn in ns.items() if name.startswith('test_')]; print('all tests passed')"
    )
    return f'python3 -c "{runner}"'



def tier1(ctx: GenContext) -> Task:
    """Fix a one-line bug in a small function."""
    spec = ctx.choice(SPECS[ctx.split])
    module = ctx.words(1)[0]
    module_path, tests = f"{module}.py", f"tests/test_{module}.py"
    buggy, good, bad = break_source(spec)
    test_text = render_tests([(module, spec.name)], {spec.name: make_cases(ctx, spec, buggy)})
    return ctx.task(
        subtype="fix_one",
        instruction=ctx.say(FIX_ONE, module_path=module_path, tests=tests),
        verifier=PytestPasses(tests),
        gold=[Action.run(f"cat {module_path}"), _checked_edit(module_path, buggy, bad, good)],
        files={module_path: buggy, tests: test_text},
        protected_files={tests: test_text},
        skills=(*SKILLS, "debugging"),
    )


def tier2(ctx: GenContext) -> Task:
    """Implement a stubbed function from its docstring and tests."""
    spec = ctx.choice(SPECS[ctx.split])
    module = ctx.words(1)[0]
    module_path, tests = f"{module}.py", f"tests/test_{module}.py"
    stub = spec.signature_and_doc()
    test_text = render_tests([(module, spec.name)], {spec.name: make_cases(ctx, spec, stub)})
    return ctx.task(
        subtype="implement",
        instruction=ctx.say(IMPLEMENT, name=spec.name, module_path=module_path, tests=tests),
        verifier=PytestPasses(tests),
        gold=[Action.run(f"cat {module_path} {tests}"), Action.write(module_path, spec.source),
              Action.run(_test_command(tests))],
        files={module_path: stub, tests: test_text},
        protected_files={tests: test_text},
        skills=(*SKILLS, "implementation"),
    )


def tier3(ctx: GenContext) -> Task:
    """Fix bugs in two functions of one module."""
    first, second = ctx.sample(SPECS[ctx.split], 2)
    module = ctx.words(1)[0]
    module_path, tests = f"{module}.py", f"tests/test_{module}.py"
    broken = [break_source(spec) for spec in (first, second)]
    source = "\n\n".join(b[0] for b in broken)
    cases = {spec.name: make_cases(ctx, spec, b[0]) for spec, b in zip((first, second), broken, strict=True)}
    test_text = render_tests([(module, first.name), (module, second.name)], cases)
    return ctx.task(
        subtype="fix_two",
        instruction=ctx.say(FIX_TWO, module_path=module_path, tests=tests,
                            names=f"{first.name}` and `{second.name}"),
        verifier=PytestPasses(tests),
        gold=[
            Action.run(_test_command(tests)),
            Action.run(f"cat {module_path}"),
            _checked_edit(module_path, source, broken[0][2], broken[0][1]),
            _checked_edit(module_path, source, broken[1][2], broken[1][1]),
            Action.run(_test_command(tests)),
        ],
        files={module_path: source, tests: test_text},
        protected_files={tests: test_text},
        skills=(*SKILLS, "debugging"),
    )


def tier4(ctx: GenContext) -> Task:
    """A package across files: one stub to implement and two bugs in two modules."""
    bug_a, stub_spec, bug_b = ctx.sample(SPECS[ctx.split], 3)
    package, mod_a, mod_b = ctx.words(3)
    tests = f"tests/test_{package}.py"
    path_a, path_b = f"{package}/{mod_a}.py", f"{package}/{mod_b}.py"
    broken_a, broken_b = break_source(bug_a), break_source(bug_b)
    stub = stub_spec.signature_and_doc()
    source_a = broken_a[0]
    source_b = broken_b[0] + "\n\n" + stub
    correct_b = bug_b.source + "\n\n" + stub_spec.source
    cases = {
        bug_a.name: make_cases(ctx, bug_a, broken_a[0]),
        stub_spec.name: make_cases(ctx, stub_spec, stub),
        bug_b.name: make_cases(ctx, bug_b, broken_b[0]),
    }
    test_text = render_tests(
        [(f"{package}.{mod_a}", bug_a.name), (f"{package}.{mod_b}", stub_spec.name),
         (f"{package}.{mod_b}", bug_b.name)], cases)
    files: dict[str, str | bytes] = {
        f"{package}/__init__.py": f'"""The {package} helpers."""\n',
        path_a: source_a, path_b: source_b, tests: test_text,
    }
    return ctx.task(
        subtype="package",
        instruction=ctx.say(PACKAGE, package=package, tests=tests, stub=f"{package}.{mod_b}.{stub_spec.name}"),
        verifier=PytestPasses(tests),
        gold=[
            Action.run(f"ls -R {package} tests"),
            Action.run(_test_command(tests)),
            Action.run(f"cat {path_a} {path_b}"),
            _checked_edit(path_a, source_a, broken_a[2], broken_a[1]),
            Action.write(path_b, correct_b),
            Action.run(_test_command(tests)),
        ],
        files=files,
        protected_files={tests: test_text},
        skills=(*SKILLS, "debugging", "implementation"),
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
