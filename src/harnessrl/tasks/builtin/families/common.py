"""Shared machinery of the workspace generators: the seeded context, paraphrases and fixtures."""

from __future__ import annotations

import csv
import io
import random
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from harnessrl.tasks.builtin.families.vocab import VOCABULARIES, Vocabulary
from harnessrl.tasks.model import Action, Task, TaskSetup
from harnessrl.tasks.verify import AnswerEquals, AnyOf, Check

SPLITS: tuple[str, ...] = ("train", "test")
TIERS: tuple[int, ...] = (1, 2, 3, 4)

#: Every paraphrase set ever declared, for tests that check variety and split disjointness.
ALL_TEMPLATES: list[Templates] = []


@dataclass(frozen=True)
class Templates:
    """The paraphrased instruction wordings of one task type.

    Train and test wordings are separate lists, so a test task is never phrased the way any
    train task is. Fields are filled with ``str.format``.
    """

    key: str
    train: tuple[str, ...]
    test: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.train) < 3 or len(self.test) < 3:
            raise ValueError(f"templates {self.key}: need >= 3 wordings per split")
        if set(self.train) & set(self.test):
            raise ValueError(f"templates {self.key}: a wording is shared by train and test")
        ALL_TEMPLATES.append(self)

    def for_split(self, split: str) -> tuple[str, ...]:
        """Returns the wordings of ``split``."""
        return self.train if split == "train" else self.test


class GenContext:
    """Everything one task's generator may draw from: a private seeded RNG and the split's names.

    The RNG is seeded from (split, family, tier, index) only, so a task id alone regenerates
    its task, whatever else was generated before.
    """

    def __init__(self, split: str, family: str, tier: int, index: int) -> None:
        self.split = split
        self.family = family
        self.tier = tier
        self.index = index
        self.rng = random.Random(f"harnessrl/workspace/{split}/{family}/{tier}/{index}")
        self.vocab: Vocabulary = VOCABULARIES[split]
        self.template_id = ""

    @property
    def task_id(self) -> str:
        """Returns the id ``ws-<split>-<family>-<tier>-<index>`` of the task being generated."""
        return f"ws-{self.split}-{self.family}-{self.tier}-{self.index}"

    @property
    def is_test(self) -> bool:
        """True when generating the test split (which uses its own schemas and formats)."""
        return self.split == "test"

    def choice(self, options: Sequence[Any]) -> Any:
        """Returns one element of ``options``."""
        return self.rng.choice(options)

    def sample(self, options: Sequence[Any], k: int) -> list[Any]:
        """Returns ``k`` distinct elements of ``options`` in random order."""
        return self.rng.sample(list(options), k)

    def words(self, k: int) -> list[str]:
        """Returns ``k`` distinct name stems from the split's word pool."""
        return self.sample(self.vocab.words, k)

    def say(self, templates: Templates, **values: Any) -> str:
        """Returns one of the split's wordings of ``templates`` filled with ``values``."""
        options = templates.for_split(self.split)
        number = self.rng.randrange(len(options))
        self.template_id = f"{templates.key}/{self.split}/{number}"
        return options[number].format(**values).strip()

    def task(
        self,
        *,
        subtype: str,
        instruction: str,
        verifier: Check,
        gold: list[Action],
        files: dict[str, str | bytes] | None = None,
        builder: Any = None,
        script: str | None = None,
        skills: Sequence[str] = (),
        protected_files: dict[str, str] | None = None,
        expects_answer: bool = False,
    ) -> Task:
        """Returns the finished task with id, family, tier, split, tags and metadata filled in."""
        tags = [self.family, *skills]
        if expects_answer:
            tags.append("answer")
        if self.tier >= 3:
            tags.append("multi-step")
        return Task(
            id=self.task_id,
            instruction=instruction,
            verifier=verifier,
            gold=gold,
            setup=TaskSetup(files=dict(files or {}), script=script, builder=builder),
            family=self.family,
            tier=self.tier,
            split=self.split,
            tags=tuple(dict.fromkeys(tags)),
            protected_files=dict(protected_files or {}),
            expects_answer=expects_answer,
            metadata={"suite": "workspace", "subtype": f"{self.family}.{subtype}",
                      "template": self.template_id, "index": self.index},
        )


# --- fixtures --------------------------------------------------------------------------------


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Returns CSV text with ``\\n`` line endings (what the csv module writes by default, but LF)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def lines_text(lines: Sequence[str]) -> str:
    """Returns ``lines`` joined with newlines, ending in one."""
    return "".join(f"{line}\n" for line in lines)


def build_sqlite(root: Path, db: str, sql: str) -> None:
    """Creates the sqlite database ``db`` under the workspace ``root`` by running ``sql``.

    A module-level function so that ``functools.partial(build_sqlite, db=..., sql=...)`` is a
    picklable ``TaskSetup.builder``.
    """
    root = Path(root)
    path = root / db
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    connection = sqlite3.connect(path)
    try:
        connection.executescript(sql)
        connection.commit()
    finally:
        connection.close()


def sqlite_builder(db: str, sql: str) -> partial[None]:
    """Returns the setup builder that lays the database ``db`` built by ``sql``."""
    return partial(build_sqlite, db=db, sql=sql)


def sql_literal(value: Any) -> str:
    """Returns ``value`` as a SQL literal (strings single-quoted with quotes doubled)."""
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def insert_sql(table: str, rows: Sequence[Sequence[Any]]) -> str:
    """Returns INSERT statements for ``rows`` of ``table``."""
    return "".join(
        f"INSERT INTO {table} VALUES ({', '.join(sql_literal(v) for v in row)});\n" for row in rows
    )


# --- answers ---------------------------------------------------------------------------------


def path_answer(path: str) -> Check:
    """Returns the check that the submitted answer is ``path`` (with or without a leading ``./``)."""
    return AnyOf(checks=(AnswerEquals(path, mode="exact"), AnswerEquals(f"./{path}", mode="exact")))


def number_answer(value: float) -> Check:
    """Returns the check that the submitted answer's first number is ``value``."""
    return AnswerEquals(format_number(value), mode="number", tolerance=0.005)


def format_number(value: float) -> str:
    """Returns an integer without decimals and anything else with two."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}"


def money(cents: int) -> str:
    """Returns an amount in cents as a decimal string with two places (``1234`` -> ``12.34``)."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def code_block(text: str) -> str:
    """Returns ``text`` fenced as a code block for an instruction."""
    return f"```\n{text.rstrip()}\n```"
