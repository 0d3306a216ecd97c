"""The ``sqlite`` family: query and update a database (DBBench-like)."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.tasks.builtin.families.common import (
    GenContext,
    Templates,
    insert_sql,
    number_answer,
    sqlite_builder,
)
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, AnswerEquals, SqliteQuery

SKILLS = ("sqlite", "sql")


@dataclass(frozen=True)
class Schema:
    """Table and column names of a split's database; train and test use different ones."""

    table: str
    name: str
    group: str
    amount: str
    place: str
    extra_table: str
    extra_fk: str
    extra_amount: str
    extra_year: str
    percents: tuple[int, ...]
    amount_range: tuple[int, int]  # in hundreds

    def create_sql(self) -> str:
        """Returns the CREATE TABLE statements of both tables."""
        return (
            f"CREATE TABLE {self.table} (id INTEGER PRIMARY KEY, {self.name} TEXT NOT NULL, "
            f"{self.group} TEXT NOT NULL, {self.amount} INTEGER NOT NULL, {self.place} TEXT NOT NULL);\n"
            f"CREATE TABLE {self.extra_table} ({self.extra_fk} INTEGER NOT NULL REFERENCES "
            f"{self.table}(id), {self.extra_amount} INTEGER NOT NULL, {self.extra_year} INTEGER NOT NULL);\n"
        )


TRAIN_SCHEMA = Schema("staff", "name", "team", "salary", "city", "bonuses", "staff_id", "amount",
                      "year", (5, 10, 20), (30, 90))
TEST_SCHEMA = Schema("members", "handle", "squad", "points", "base", "awards", "member_id", "bonus",
                     "season", (15, 25, 30), (10, 25))

Record = tuple[int, str, str, int, str]


def make_records(ctx: GenContext, count: int) -> list[Record]:
    """Returns ``count`` rows (id, name, group, amount, place) with unique names."""
    schema = schema_for(ctx)
    low, high = schema.amount_range
    names = ctx.sample(ctx.vocab.people, count)
    groups = ctx.sample(ctx.vocab.categories, 4)
    places = ctx.sample(ctx.vocab.places, 4)
    return [
        (n + 1, name, ctx.choice(groups), ctx.rng.randint(low, high) * 100, ctx.choice(places))
        for n, name in enumerate(names)
    ]


def schema_for(ctx: GenContext) -> Schema:
    """Returns the split's schema."""
    return TEST_SCHEMA if ctx.is_test else TRAIN_SCHEMA


def db_path(ctx: GenContext) -> str:
    """Returns a fresh database path such as ``otter/maple.db``."""
    folder, stem = ctx.words(2)
    return f"{folder}/{stem}.db"


COUNT = Templates(
    "sqlite.count",
    train=(
        "The sqlite database `{db}` has a table `{table}`. How many rows have `{group}` = '{value}'? Submit the number.",
        "Query `{db}`: count the `{table}` rows whose `{group}` is '{value}', and submit that count.",
        "Using the database file `{db}`, find how many entries in `{table}` belong to the {group} '{value}'. Submit just the number.",
    ),
    test=(
        "Open the sqlite file `{db}` and report (submit) the number of `{table}` records with {group} '{value}'.",
        "In `{db}`, table `{table}`, for how many rows does `{group}` equal '{value}'? Answer with the count.",
        "Submit the count of '{value}' rows (column `{group}`) in the `{table}` table of `{db}`.",
    ),
)

TOP_GROUP = Templates(
    "sqlite.top_group",
    train=(
        "In the sqlite database `{db}`, which `{group}` has the highest total `{amount}` in table `{table}`? Submit its name.",
        "Find the {group} whose members' `{amount}` values add up to the most in `{db}` (table `{table}`). Submit the {group} name.",
        "Query `{db}` and submit the `{group}` value with the largest SUM of `{amount}` across the `{table}` table.",
    ),
    test=(
        "Which {group} in `{db}` (`{table}` table) has the biggest combined `{amount}`? Submit only its name.",
        "Group the rows of `{table}` in `{db}` by `{group}` and submit the one whose summed `{amount}` is highest.",
        "Submit the name of the top {group} by total `{amount}`, according to the `{table}` table of the database `{db}`.",
    ),
)

UPDATE_ONE = Templates(
    "sqlite.update_one",
    train=(
        "In the sqlite database `{db}`, {who} has moved: in table `{table}`, set the `{place}` of the row whose `{name}` is '{who}' to '{value}'.",
        "Update `{db}`: the `{table}` row with `{name}` = '{who}' must have `{place}` = '{value}'. Change nothing else.",
        "Change the `{place}` of '{who}' (column `{name}`) to '{value}' in the `{table}` table of `{db}`.",
    ),
    test=(
        "Record in `{db}` that '{who}' (`{name}` column) is now at '{value}' (column `{place}` of `{table}`); leave the other rows untouched.",
        "`{db}` is outdated: the `{place}` of the `{table}` row whose `{name}` is '{who}' should be '{value}'. Fix that row.",
        "Please set `{place}` to '{value}' for `{name}` '{who}' in `{table}` (database `{db}`).",
    ),
)

RAISE_DELETE = Templates(
    "sqlite.raise_delete",
    train=(
        "Two changes to the sqlite database `{db}`, table `{table}`: increase the `{amount}` of every row with `{group}` = '{group_value}' by {percent}% (results stay whole numbers), and delete every row whose `{place}` is '{place_value}'.",
        "Update `{db}`: the '{group_value}' {group} gets a {percent} percent raise of `{amount}` in table `{table}`, and all `{table}` rows located in '{place_value}' (column `{place}`) must be removed.",
        "In `{table}` of `{db}`, delete the rows with `{place}` '{place_value}', then raise `{amount}` by {percent}% for the remaining rows of {group} '{group_value}'. Amounts are integers.",
    ),
    test=(
        "Apply these edits to `{db}`: (1) rows of `{table}` whose `{place}` is '{place_value}' are dropped; (2) `{amount}` grows by {percent}% for each row in {group} '{group_value}' (keep integer values).",
        "`{table}` in the sqlite file `{db}` needs maintenance: remove everything at `{place}` = '{place_value}' and bump `{amount}` by {percent} percent for `{group}` '{group_value}' (whole numbers).",
        "Please modify `{db}` so that no `{table}` row has `{place}` '{place_value}' any more, and every '{group_value}' row ({group}) has its `{amount}` multiplied by {factor} (integer result).",
    ),
)

SUMMARY_TABLE = Templates(
    "sqlite.summary_table",
    train=(
        "In the sqlite database `{db}`, create a table `{summary}({group} TEXT PRIMARY KEY, headcount INTEGER, total INTEGER)` with one row per {group} in `{table}`: headcount = number of rows, total = sum of `{amount}` plus the `{extra_amount}` values from `{extra_table}` for {extra_year} {year} (matched on `{extra_fk}` = `{table}.id`). Then submit the {group} with the largest total.",
        "Build a summary in `{db}`: a new table `{summary}` with columns `{group}` (text, primary key), `headcount` and `total` (integers). For each {group}: headcount counts its `{table}` rows; total adds their `{amount}` and every `{extra_table}.{extra_amount}` of {extra_year} {year} belonging to them (`{extra_fk}` references `{table}.id`). Submit the {group} whose total is highest.",
        "Using `{db}`, compute per {group} of `{table}`: the number of rows and the sum of `{amount}` plus their {extra_year}-{year} `{extra_amount}` entries in `{extra_table}` (joined via `{extra_fk}`). Store these as rows of a new table `{summary}({group} TEXT PRIMARY KEY, headcount INTEGER, total INTEGER)` and submit the {group} with the top total.",
    ),
    test=(
        "Create `{summary}` in `{db}` with schema `({group} TEXT PRIMARY KEY, headcount INTEGER, total INTEGER)`. Fill it with one row per {group} of `{table}`: how many rows it has, and the total of their `{amount}` plus any `{extra_amount}` from `{extra_table}` in {extra_year} {year} (`{extra_fk}` points to `{table}.id`). Submit the {group} that ends up with the highest total.",
        "The database `{db}` needs an aggregate table `{summary}` (`{group}` TEXT PRIMARY KEY, `headcount` INTEGER, `total` INTEGER): per {group}, headcount = its member rows in `{table}`, total = Σ `{amount}` + Σ `{extra_table}.{extra_amount}` restricted to {extra_year} {year}, linked by `{extra_fk}`. Afterwards submit the {group} with the maximum total.",
        "Please summarise `{table}` by {group} inside `{db}`: new table `{summary}({group} TEXT PRIMARY KEY, headcount INTEGER, total INTEGER)`, where total includes each row's `{amount}` and the `{extra_amount}` awarded to it in {extra_year} {year} (table `{extra_table}`, key `{extra_fk}`). Then submit the name of the {group} with the greatest total.",
    ),
)


def sqlite3_cmd(db: str, sql: str) -> str:
    """Returns a shell command that runs ``sql`` with the sqlite3 CLI."""
    return f"sqlite3 {db} <<'SQL'\n{sql.strip()}\nSQL"


def tier1(ctx: GenContext) -> Task:
    """One query, one answer: a filtered count."""
    schema = schema_for(ctx)
    db = db_path(ctx)
    records = make_records(ctx, ctx.rng.randint(8, 14))
    value = ctx.choice(records)[2]
    count = sum(r[2] == value for r in records)
    query = f"SELECT COUNT(*) FROM {schema.table} WHERE {schema.group} = '{value}';"
    return ctx.task(
        subtype="count",
        instruction=ctx.say(COUNT, db=db, table=schema.table, group=schema.group, value=value),
        verifier=number_answer(count),
        gold=[Action.run(sqlite3_cmd(db, query)), Action.submit(str(count))],
        builder=sqlite_builder(db, schema.create_sql() + insert_sql(schema.table, records)),
        skills=SKILLS, expects_answer=True,
    )


def tier2(ctx: GenContext) -> Task:
    """An aggregate answer (top group by total) or a one-row update."""
    schema = schema_for(ctx)
    db = db_path(ctx)
    while True:
        records = make_records(ctx, ctx.rng.randint(8, 14))
        totals: dict[str, int] = {}
        for r in records:
            totals[r[2]] = totals.get(r[2], 0) + r[3]
        ranked = sorted(totals.values(), reverse=True)
        if len(ranked) == 1 or ranked[0] != ranked[1]:
            break
    sql = schema.create_sql() + insert_sql(schema.table, records)
    if ctx.rng.random() < 0.5:
        top = max(totals, key=lambda k: totals[k])
        query = (f"SELECT {schema.group}, SUM({schema.amount}) AS total FROM {schema.table} "
                 f"GROUP BY {schema.group} ORDER BY total DESC;")
        return ctx.task(
            subtype="top_group",
            instruction=ctx.say(TOP_GROUP, db=db, table=schema.table, group=schema.group,
                                amount=schema.amount),
            verifier=AnswerEquals(top, mode="casefold"),
            gold=[Action.run(sqlite3_cmd(db, ".schema")), Action.run(sqlite3_cmd(db, query)),
                  Action.submit(top)],
            builder=sqlite_builder(db, sql), skills=(*SKILLS, "aggregation"), expects_answer=True,
        )
    target = ctx.choice(records)
    new_place = ctx.choice([p for p in ctx.vocab.places if p != target[4]])
    expected = [[r[1], new_place if r[0] == target[0] else r[4]] for r in records]
    update = (f"UPDATE {schema.table} SET {schema.place} = '{new_place}' "
              f"WHERE {schema.name} = '{target[1]}';")
    return ctx.task(
        subtype="update_one",
        instruction=ctx.say(UPDATE_ONE, db=db, table=schema.table, place=schema.place,
                            value=new_place, name=schema.name, who=target[1]),
        verifier=SqliteQuery(db, f"SELECT {schema.name}, {schema.place} FROM {schema.table} ORDER BY id",
                             expected),
        gold=[Action.run(sqlite3_cmd(db, f"SELECT * FROM {schema.table} WHERE {schema.name} = '{target[1]}';")),
              Action.run(sqlite3_cmd(db, update))],
        builder=sqlite_builder(db, sql), skills=(*SKILLS, "update"),
    )


def tier3(ctx: GenContext) -> Task:
    """Two dependent writes: a percentage raise for one group and a delete by place."""
    schema = schema_for(ctx)
    db = db_path(ctx)
    while True:
        records = make_records(ctx, ctx.rng.randint(10, 16))
        group_value = ctx.choice(records)[2]
        place_value = ctx.choice(records)[4]
        deleted = [r for r in records if r[4] == place_value]
        raised = [r for r in records if r[2] == group_value and r[4] != place_value]
        if deleted and raised and len(deleted) < len(records) // 2:
            break
    percent = ctx.choice(schema.percents)
    expected = [
        [r[0], r[1], r[2], r[3] * (100 + percent) // 100 if r[2] == group_value else r[3], r[4]]
        for r in records if r[4] != place_value
    ]
    sql_change = (
        f"DELETE FROM {schema.table} WHERE {schema.place} = '{place_value}';\n"
        f"UPDATE {schema.table} SET {schema.amount} = {schema.amount} * {100 + percent} / 100 "
        f"WHERE {schema.group} = '{group_value}';"
    )
    factor = f"{(100 + percent) / 100:g}"
    return ctx.task(
        subtype="raise_delete",
        instruction=ctx.say(RAISE_DELETE, db=db, table=schema.table, group=schema.group,
                            amount=schema.amount, place=schema.place, group_value=group_value,
                            place_value=place_value, percent=percent, factor=factor),
        verifier=SqliteQuery(db, f"SELECT id, {schema.name}, {schema.group}, {schema.amount}, "
                                 f"{schema.place} FROM {schema.table} ORDER BY id", expected),
        gold=[
            Action.run(sqlite3_cmd(db, ".schema")),
            Action.run(sqlite3_cmd(db, f"SELECT * FROM {schema.table} WHERE {schema.group} = "
                                       f"'{group_value}' OR {schema.place} = '{place_value}';")),
            Action.run(sqlite3_cmd(db, sql_change)),
            Action.run(sqlite3_cmd(db, f"SELECT COUNT(*) FROM {schema.table};")),
        ],
        builder=sqlite_builder(db, schema.create_sql() + insert_sql(schema.table, records)),
        skills=(*SKILLS, "update"),
    )


def tier4(ctx: GenContext) -> Task:
    """Join two tables into a new summary table, then answer from it."""
    schema = schema_for(ctx)
    db = db_path(ctx)
    summary = f"{ctx.words(1)[0]}_summary"
    year = ctx.choice(ctx.vocab.years[1:])
    while True:
        records = make_records(ctx, ctx.rng.randint(10, 16))
        extras = []
        for r in ctx.sample(records, len(records) * 2 // 3):
            for _ in range(ctx.rng.randint(1, 2)):
                extras.append((r[0], ctx.rng.randint(1, 40) * 10,
                               ctx.choice((year, year, ctx.vocab.years[0]))))
        totals: dict[str, list[int]] = {}
        for r in records:
            entry = totals.setdefault(r[2], [0, 0])
            entry[0] += 1
            entry[1] += r[3] + sum(e[1] for e in extras if e[0] == r[0] and e[2] == year)
        ranked = sorted((v[1] for v in totals.values()), reverse=True)
        if len(ranked) > 1 and ranked[0] != ranked[1]:
            break
    top = max(totals, key=lambda k: totals[k][1])
    expected = [[group, v[0], v[1]] for group, v in sorted(totals.items())]
    s = schema
    build = (
        f"CREATE TABLE {summary} ({s.group} TEXT PRIMARY KEY, headcount INTEGER, total INTEGER);\n"
        f"INSERT INTO {summary}\n"
        f"SELECT t.{s.group}, COUNT(*), SUM(t.{s.amount} + COALESCE(e.extra, 0))\n"
        f"FROM {s.table} t LEFT JOIN (SELECT {s.extra_fk}, SUM({s.extra_amount}) AS extra "
        f"FROM {s.extra_table} WHERE {s.extra_year} = {year} GROUP BY {s.extra_fk}) e "
        f"ON e.{s.extra_fk} = t.id\nGROUP BY t.{s.group};"
    )
    sql = s.create_sql() + insert_sql(s.table, records) + insert_sql(s.extra_table, extras)
    return ctx.task(
        subtype="summary_table",
        instruction=ctx.say(SUMMARY_TABLE, db=db, table=s.table, group=s.group, amount=s.amount,
                            extra_table=s.extra_table, extra_amount=s.extra_amount,
                            extra_fk=s.extra_fk, extra_year=s.extra_year, year=year,
                            summary=summary),
        verifier=AllOf(checks=(
            SqliteQuery(db, f"SELECT {s.group}, headcount, total FROM {summary} ORDER BY {s.group}",
                        expected),
            AnswerEquals(top, mode="casefold"),
        )),
        gold=[
            Action.run(sqlite3_cmd(db, ".schema")),
            Action.run(sqlite3_cmd(db, f"SELECT * FROM {s.extra_table} LIMIT 5;")),
            Action.run(sqlite3_cmd(db, build)),
            Action.run(sqlite3_cmd(db, f"SELECT * FROM {summary} ORDER BY total DESC;")),
            Action.submit(top),
        ],
        builder=sqlite_builder(db, sql), skills=(*SKILLS, "join", "aggregation"),
        expects_answer=True,
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
