"""The ``data`` family: CSV and JSON counting, filtering, conversion, aggregation and joins."""

from __future__ import annotations

import json
from dataclasses import dataclass

from harnessrl.tasks.builtin.families.common import (
    GenContext,
    Templates,
    csv_text,
    money,
    number_answer,
)
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, AnswerEquals, FileEquals, JsonField

SKILLS = ("data", "csv")


@dataclass(frozen=True)
class Columns:
    """Column names of a split's order table; train and test use different schemas."""

    id: str
    person: str
    item: str
    category: str
    qty: str
    price: str
    place: str

    @property
    def header(self) -> tuple[str, ...]:
        """Returns the column names in file order."""
        return (self.id, self.person, self.item, self.category, self.qty, self.price, self.place)


TRAIN_COLUMNS = Columns("order_id", "customer", "item", "category", "qty", "unit_price", "city")
TEST_COLUMNS = Columns("asset_id", "owner", "device", "team", "units", "unit_cost", "site")


@dataclass(frozen=True)
class Row:
    """One record of the generated table (prices in cents)."""

    id: int
    person: str
    item: str
    category: str
    qty: int
    price_cents: int
    place: str

    def cells(self) -> list[str | int]:
        """Returns the row as CSV cells (the price formatted with two decimals)."""
        return [self.id, self.person, self.item, self.category, self.qty, money(self.price_cents), self.place]


def columns_for(ctx: GenContext) -> Columns:
    """Returns the split's column names."""
    return TEST_COLUMNS if ctx.is_test else TRAIN_COLUMNS


def make_rows(ctx: GenContext, count: int) -> list[Row]:
    """Returns ``count`` random records; ids start at a split-specific offset."""
    v = ctx.vocab
    people = ctx.sample(v.people, 6)
    items = ctx.sample(v.items, 6)
    base = 5000 if ctx.is_test else 100
    item_category = {item: ctx.choice(v.categories[:4]) for item in items}
    rows = []
    row_id = base
    for _ in range(count):
        item = ctx.choice(items)
        row_id += ctx.rng.randint(1, 4)
        rows.append(Row(
            id=row_id, person=ctx.choice(people), item=item,
            category=item_category[item], qty=ctx.rng.randint(1, 9),
            price_cents=ctx.rng.randint(150, 9999), place=ctx.choice(v.places[:5]),
        ))
    return rows


COUNT = Templates(
    "data.count",
    train=(
        "How many rows of `{path}` have `{column}` equal to `{value}`? Submit just the number.",
        "Count the records in `{path}` whose `{column}` is `{value}` and submit the count.",
        "Look at the CSV file `{path}`. Submit the number of data rows where the `{column}` column reads `{value}`.",
    ),
    test=(
        "Report (via submit) how many entries of `{path}` list `{value}` as their `{column}`.",
        "In the table `{path}`, for how many lines (header excluded) is `{column}` = `{value}`? Answer with the number only.",
        "Tell me the number of `{value}` rows (column `{column}`) in `{path}`. Submit it as your answer.",
    ),
)

SUM = Templates(
    "data.sum",
    train=(
        "What is the total `{qty}` over all rows of `{path}` whose `{column}` is `{value}`? Submit the number.",
        "Sum the `{qty}` column of `{path}` for the rows with `{column}` = `{value}` and submit the total.",
        "Using `{path}`, add up `{qty}` across every `{value}` row (column `{column}`). Submit only the sum.",
    ),
    test=(
        "Submit the sum of `{qty}` for entries of `{path}` where `{column}` equals `{value}`.",
        "Compute the combined `{qty}` of all `{value}` records (by `{column}`) in `{path}`; answer with that number.",
        "From `{path}`, how many `{qty}` in total belong to rows whose `{column}` is `{value}`? Submit the figure.",
    ),
)

FILTER = Templates(
    "data.filter",
    train=(
        "Write the rows of `{path}` whose `{column}` is `{value}` to `{out}`, keeping the header line and the original row order.",
        "Create `{out}` containing the header of `{path}` followed by only the rows with `{column}` = `{value}` (same order, same format).",
        "Filter `{path}`: keep the header and the `{value}` rows (column `{column}`), and save the result as `{out}`.",
    ),
    test=(
        "Extract every `{value}` record (by `{column}`) from `{path}` into a new CSV `{out}`; include the header and keep the rows in their original order.",
        "`{out}` should be a copy of `{path}` restricted to rows where `{column}` equals `{value}` (header kept, order unchanged, values unchanged).",
        "Produce `{out}`: the header line of `{path}` plus those lines whose `{column}` field is `{value}`, in file order.",
    ),
)

CONVERT = Templates(
    "data.convert",
    train=(
        "Convert `{path}` to JSON: write `{out}` containing a list with one object per row, keys taken from the header. `{ints}` must be an integer and `{price}` a number; the other fields stay strings.",
        "Turn the CSV `{path}` into `{out}`, a JSON array of objects (one per row, in order, keys = column names). Store `{ints}` as integers, `{price}` as a number, everything else as strings.",
        "Export `{path}` as JSON to `{out}`: an array of row objects keyed by column name, in row order, with numeric `{ints}` (integer) and `{price}` (number) values and string values elsewhere.",
    ),
    test=(
        "Make a JSON version of `{path}` at `{out}`. It must be a list of objects, one for each CSV row in order, with the column names as keys; `{ints}` are integers, `{price}` is a number, all other values strings.",
        "Please serialise the rows of `{path}` into `{out}` as a JSON list of dicts (header names as keys, original order). Numbers: `{ints}` as integers and `{price}` as a float; other columns as text.",
        "`{out}` should hold the content of `{path}` in JSON form: an array whose items are the rows as objects keyed by column name. Use integers for `{ints}`, a number for `{price}`, strings for the rest.",
    ),
)

GROUP = Templates(
    "data.group_total",
    train=(
        "Compute the revenue per `{category}` in `{path}` (revenue of a row = `{qty}` × `{price}`). Write `{out}` as a JSON object mapping each `{category}` to its total revenue, rounded to 2 decimals.",
        "Aggregate `{path}` by `{category}`: for each value, sum `{qty}` times `{price}` over its rows. Save a JSON object `{{\"<{category}>\": <total>, ...}}` to `{out}` with totals rounded to two decimals.",
        "Using `{path}`, find the total value (`{qty}` * `{price}`) of each `{category}` and store the result in `{out}` as one JSON object keyed by `{category}` (numbers rounded to 2 places).",
    ),
    test=(
        "Group the rows of `{path}` by `{category}` and total `{qty}` × `{price}` for each group. Write the totals to `{out}` as a JSON object whose keys are the `{category}` values (round to 2 decimals).",
        "For every `{category}` appearing in `{path}`, how much is it worth in total (sum of `{qty}` multiplied by `{price}`)? Put the answers in `{out}` as a JSON mapping from `{category}` to amount, 2-decimal rounding.",
        "`{out}` must contain a JSON object: key = a `{category}` from `{path}`, value = the sum over its rows of `{qty}`*`{price}`, rounded to two decimal places.",
    ),
)

JOIN = Templates(
    "data.join_rank",
    train=(
        "`{orders}` lists orders (`{person}`, `{item}`, `{qty}`) and `{prices}` maps each `{item}` to its unit price. Compute each {person}'s total spend (sum of `{qty}` × price), write `{out}` with header `{person},total` and one row per {person}, sorted by total descending, totals with 2 decimals. Then submit the name of the {person} with the highest total.",
        "Join `{orders}` with the price list `{prices}` to get every {person}'s spend (quantity times unit price, summed). Save it as CSV `{out}` (header `{person},total`, highest total first, 2 decimal places) and submit the top {person}'s name.",
        "Work out how much each {person} spent: quantities come from `{orders}`, unit prices from `{prices}`. Write `{out}` (columns `{person},total`, sorted from largest to smallest total, amounts like `12.50`), then submit the name with the largest total.",
    ),
    test=(
        "Combine `{orders}` (one line per purchase: `{person}`, `{item}`, `{qty}`) with `{prices}` (unit price per `{item}`). Produce `{out}` with the header `{person},total`, one line per {person} ordered by total from high to low, two decimals; finally submit whoever has the largest total.",
        "Rank the {person}s by spend. Spend = Σ `{qty}` × unit price, where prices are in `{prices}` and purchases in `{orders}`. Output `{out}` (header `{person},total`, descending, 2-decimal totals) and submit the name at the top of the ranking.",
        "Please build `{out}`: for each {person} in `{orders}`, the sum of `{qty}` times the unit price from `{prices}`; header `{person},total`, biggest first, formatted with two decimals. Submit the name of the biggest spender.",
    ),
)


def tier1(ctx: GenContext) -> Task:
    """An answer from one pass over a CSV: a count or a sum."""
    cols = columns_for(ctx)
    folder, stem = ctx.words(2)
    path = f"{folder}/{stem}.csv"
    rows = make_rows(ctx, ctx.rng.randint(12, 20))
    files: dict[str, str | bytes] = {path: csv_text(cols.header, [r.cells() for r in rows])}
    if ctx.rng.random() < 0.5:
        value = ctx.choice(rows).category
        count = sum(r.category == value for r in rows)
        idx = cols.header.index(cols.category) + 1
        return ctx.task(
            subtype="count",
            instruction=ctx.say(COUNT, path=path, column=cols.category, value=value),
            verifier=number_answer(count),
            gold=[Action.run(f"awk -F, 'NR > 1 && ${idx} == \"{value}\"' {path} | wc -l"),
                  Action.submit(str(count))],
            files=files, skills=SKILLS, expects_answer=True,
        )
    value = ctx.choice(rows).item
    total = sum(r.qty for r in rows if r.item == value)
    item_idx, qty_idx = cols.header.index(cols.item) + 1, cols.header.index(cols.qty) + 1
    return ctx.task(
        subtype="sum",
        instruction=ctx.say(SUM, path=path, column=cols.item, value=value, qty=cols.qty),
        verifier=number_answer(total),
        gold=[Action.run(f"awk -F, 'NR > 1 && ${item_idx} == \"{value}\" {{ s += ${qty_idx} }} END {{ print s }}' {path}"),
              Action.submit(str(total))],
        files=files, skills=SKILLS, expects_answer=True,
    )


_CONVERT_SCRIPT = """python3 - <<'PY'
import csv, json
rows = list(csv.DictReader(open({path!r})))
for row in rows:
    for key in {ints!r}:
        row[key] = int(row[key])
    row[{price!r}] = float(row[{price!r}])
json.dump(rows, open({out!r}, "w"), indent=2)
PY"""


def tier2(ctx: GenContext) -> Task:
    """Write a derived file: a filtered CSV or a JSON conversion."""
    cols = columns_for(ctx)
    folder, stem, out_stem = ctx.words(3)
    path = f"{folder}/{stem}.csv"
    rows = make_rows(ctx, ctx.rng.randint(8, 14))
    text = csv_text(cols.header, [r.cells() for r in rows])
    if ctx.rng.random() < 0.5:
        value = ctx.choice(rows).place
        out = f"{folder}/{out_stem}.csv"
        expected = csv_text(cols.header, [r.cells() for r in rows if r.place == value])
        idx = cols.header.index(cols.place) + 1
        return ctx.task(
            subtype="filter",
            instruction=ctx.say(FILTER, path=path, out=out, column=cols.place, value=value),
            verifier=FileEquals(out, expected),
            gold=[Action.run(f"head -n 3 {path}"),
                  Action.run(f"awk -F, 'NR == 1 || ${idx} == \"{value}\"' {path} > {out}")],
            files={path: text}, skills=SKILLS,
        )
    out = f"{folder}/{out_stem}.json"
    records = [
        {cols.id: r.id, cols.person: r.person, cols.item: r.item, cols.category: r.category,
         cols.qty: r.qty, cols.price: r.price_cents / 100, cols.place: r.place}
        for r in rows
    ]
    ints = [cols.id, cols.qty]
    return ctx.task(
        subtype="convert",
        instruction=ctx.say(CONVERT, path=path, out=out, ints="` and `".join(ints), price=cols.price),
        verifier=JsonField(out, "", records, tolerance=1e-6),
        gold=[Action.run(f"head -n 3 {path}"),
              Action.run(_CONVERT_SCRIPT.format(path=path, out=out, ints=ints, price=cols.price))],
        files={path: text}, skills=(*SKILLS, "json"),
    )


_GROUP_SCRIPT = """python3 - <<'PY'
import csv, json
totals = {{}}
for row in csv.DictReader(open({path!r})):
    key = row[{category!r}]
    totals[key] = totals.get(key, 0) + int(row[{qty!r}]) * float(row[{price!r}])
json.dump({{k: round(v, 2) for k, v in sorted(totals.items())}}, open({out!r}, "w"), indent=2)
PY"""


def tier3(ctx: GenContext) -> Task:
    """Group rows by a column and write per-group totals as JSON."""
    cols = columns_for(ctx)
    folder, stem, out_stem = ctx.words(3)
    path = f"{folder}/{stem}.csv"
    out = f"{folder}/{out_stem}.json"
    rows = make_rows(ctx, ctx.rng.randint(14, 22))
    totals: dict[str, int] = {}
    for r in rows:
        totals[r.category] = totals.get(r.category, 0) + r.qty * r.price_cents
    expected = {k: v / 100 for k, v in sorted(totals.items())}
    return ctx.task(
        subtype="group_total",
        instruction=ctx.say(GROUP, path=path, out=out, category=cols.category, qty=cols.qty,
                            price=cols.price),
        verifier=JsonField(out, "", expected, tolerance=0.006),
        gold=[Action.run(f"head -n 5 {path}"),
              Action.run(_GROUP_SCRIPT.format(path=path, out=out, category=cols.category,
                                              qty=cols.qty, price=cols.price)),
              Action.run(f"cat {out}")],
        files={path: csv_text(cols.header, [r.cells() for r in rows])},
        skills=(*SKILLS, "json", "aggregation"),
    )


_JOIN_SCRIPT = """python3 - <<'PY'
import csv, json
prices = json.load(open({prices!r}))
totals = {{}}
for row in csv.DictReader(open({orders!r})):
    cents = round(float(prices[row[{item!r}]]) * 100)
    totals[row[{person!r}]] = totals.get(row[{person!r}], 0) + int(row[{qty!r}]) * cents
with open({out!r}, "w") as out:
    out.write({header!r} + "\\n")
    for name, cents in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])):
        out.write(f"{{name}},{{cents // 100}}.{{cents % 100:02d}}\\n")
PY"""


def tier4(ctx: GenContext) -> Task:
    """Join a CSV with a JSON price list, rank, write a CSV, and submit the top name."""
    cols = columns_for(ctx)
    folder, orders_stem, prices_stem, out_stem = ctx.words(4)
    orders, prices_path = f"{folder}/{orders_stem}.csv", f"{folder}/{prices_stem}.json"
    out = f"{folder}/{out_stem}.csv"
    items = ctx.sample(ctx.vocab.items, 5)
    while True:
        price_cents = {item: ctx.rng.randint(200, 4999) for item in items}
        people = ctx.sample(ctx.vocab.people, 4)
        lines = [(ctx.choice(people), ctx.choice(items), ctx.rng.randint(1, 6))
                 for _ in range(ctx.rng.randint(10, 16))]
        totals: dict[str, int] = {}
        for person, item, qty in lines:
            totals[person] = totals.get(person, 0) + qty * price_cents[item]
        if len(set(totals.values())) == len(totals):  # a unique ranking
            break
    ranking = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    header = f"{cols.person},total"
    expected = header + "\n" + "".join(f"{name},{money(c)}\n" for name, c in ranking)
    files: dict[str, str | bytes] = {
        orders: csv_text((cols.person, cols.item, cols.qty), lines),
        prices_path: json.dumps({k: v / 100 for k, v in price_cents.items()}, indent=2) + "\n",
    }
    script = _JOIN_SCRIPT.format(prices=prices_path, orders=orders, item=cols.item,
                                 person=cols.person, qty=cols.qty, out=out, header=header)
    return ctx.task(
        subtype="join_rank",
        instruction=ctx.say(JOIN, orders=orders, prices=prices_path, out=out, person=cols.person,
                            item=cols.item, qty=cols.qty),
        verifier=AllOf(checks=(FileEquals(out, expected),
                               AnswerEquals(ranking[0][0], mode="casefold"))),
        gold=[Action.run(f"head -n 4 {orders}; cat {prices_path}"), Action.run(script),
              Action.run(f"head -n 2 {out}"), Action.submit(ranking[0][0])],
        files=files, skills=(*SKILLS, "json", "join", "aggregation"), expects_answer=True,
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
