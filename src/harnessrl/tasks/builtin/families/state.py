"""The ``state`` family: AppWorld-like chains where each step depends on what the last one found."""

from __future__ import annotations

import json

from harnessrl.tasks.builtin.families.common import (
    GenContext,
    Templates,
    csv_text,
    lines_text,
    money,
)
from harnessrl.tasks.builtin.families.files import filler_lines
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import AllOf, AnswerEquals, FileEquals, JsonField

SKILLS = ("state-tracking",)


def token(ctx: GenContext) -> str:
    """Returns a secret-looking token in the split's format."""
    if ctx.is_test:
        return "key_" + "".join(ctx.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(8))
    return "tok-" + "".join(ctx.choice("0123456789abcdef") for _ in range(6))


POINTER = Templates(
    "state.pointer",
    train=(
        "`{config}` names the active profile. Open that profile's file in `{dir}/` and submit the token it contains.",
        "Read `{config}` to find which profile is active, then look up that profile in `{dir}/` and submit its token.",
        "Submit the token of the currently active profile. The active profile is set in `{config}`; the profile files are kept in `{dir}/`.",
    ),
    test=(
        "Which key belongs to the profile that `{config}` marks as current? Profiles are stored under `{dir}/`. Submit that key.",
        "First check `{config}` for the current profile, then fetch the key from the matching file in `{dir}/`. Submit the key.",
        "The settings file `{config}` points at one profile in `{dir}/`. Submit the key recorded for it.",
    ),
)

CONFIG_COMPUTE = Templates(
    "state.config_compute",
    train=(
        "`{config}` tells you which CSV file to read, which column to add up, and where to write the result. Do exactly that: write the sum (just the number) to the output file it names.",
        "Follow the job description in `{config}`: sum the given column of the given source file and write the total, as a bare number, to the configured output path.",
        "A small job is configured in `{config}` (source file, column, output path). Run it by hand: compute the column total and save only that number in the output file.",
    ),
    test=(
        "Look at `{config}`: it defines a source table, a column and an output file. Put the sum of that column, and nothing else, into that output file.",
        "Execute the task described by `{config}`, i.e. total the configured column of the configured CSV and store the number at the configured destination.",
        "`{config}` holds the parameters (input, column, destination). Produce the destination file containing the column's sum as a plain number.",
    ),
)

CHAIN = Templates(
    "state.account_chain",
    train=(
        "Find the account of `{user}` in `{directory}`, read that account's file in `{accounts}/` to get its order ids, and add up the amounts of those orders in `{orders}` whose status is `{status}`. Write `{out}` as JSON: {{\"user\": ..., \"orders\": <number of {status} orders>, \"total\": <sum, 2 decimals>}}.",
        "What has `{user}` spent? `{directory}` maps users to account ids, `{accounts}/<id>.json` lists each account's orders, and `{orders}` has every order's amount and status. Count only `{status}` orders. Save {{\"user\", \"orders\" (count), \"total\" (amount)}} as a JSON object in `{out}`.",
        "Chain these lookups: user `{user}` -> account id (in `{directory}`) -> order ids (in the account file under `{accounts}/`) -> amounts and statuses (in `{orders}`). Considering only `{status}` orders, write a JSON object with keys `user`, `orders` (how many) and `total` (their summed amount) to `{out}`.",
    ),
    test=(
        "Starting from the user `{user}`, follow `{directory}` to the account id, then `{accounts}/<id>.json` to the order ids, then `{orders}` for the amounts. Summarise the `{status}` orders only in `{out}`: JSON keys `user`, `orders` (count) and `total` (sum).",
        "`{out}` must report, as a JSON object, how many `{status}` orders user `{user}` has and their total amount (keys `user`, `orders`, `total`). The user-to-account table is `{directory}`; account files in `{accounts}/` list order ids; `{orders}` holds the order details.",
        "Please total up `{user}`'s `{status}` orders. You'll need three files: `{directory}` (user -> account), `{accounts}/<account>.json` (account -> order ids) and `{orders}` (order -> amount, status). Write {{\"user\": \"{user}\", \"orders\": <count>, \"total\": <amount>}} to `{out}`.",
    ),
)

LEDGER = Templates(
    "state.ledger",
    train=(
        "Apply the transfers in `{transfers}` to the balances in `{balances}`, in file order. A transfer is rejected (and skipped) if the sender's balance at that moment is smaller than the amount. Write the final balances to `{out}` as a JSON object (name -> integer balance), write the ids of rejected transfers to `{rejected}` (one per line, in order), and submit the number of rejected transfers.",
        "Process `{transfers}` top to bottom against the starting balances in `{balances}`: move the amount from sender to receiver unless the sender currently has less than that amount, in which case reject it. Save final balances as JSON in `{out}`, list rejected transfer ids line by line in `{rejected}`, and submit how many were rejected.",
        "Simulate the ledger: balances start as in `{balances}`; each row of `{transfers}` (in order) moves money from sender to receiver, but only if the sender can cover it right then; otherwise it is rejected. Output: `{out}` with the final balances (JSON object), `{rejected}` with rejected ids one per line, and the count of rejections as your submitted answer.",
    ),
    test=(
        "Replay the requests in `{transfers}` against the stock levels in `{balances}`, in order. `in` requests add to an item's stock; `out` requests remove from it but are refused when the current stock is below the quantity. Write the final stock to `{out}` (JSON object item -> integer), the refused request ids to `{rejected}` (one per line, in order), and submit the number refused.",
        "Starting from `{balances}`, go through `{transfers}` line by line: an `in` row increases the item's stock by its quantity; an `out` row decreases it, unless the stock at that moment is too small, in which case the row is refused and changes nothing. Save the resulting stock as JSON in `{out}`, list refused ids in `{rejected}`, and submit how many were refused.",
        "Track inventory: initial counts are in `{balances}`; `{transfers}` holds `in`/`out` movements to apply sequentially, refusing any `out` that exceeds the stock available at that point. Produce `{out}` (final counts as a JSON object), `{rejected}` (ids of refused rows, one per line, in file order) and submit the refusal count.",
    ),
)


def tier1(ctx: GenContext) -> Task:
    """Two reads: a config names a profile, the profile holds the token."""
    cfg_stem, folder, *stems = ctx.words(6)
    active = ctx.choice(stems)
    tokens = {stem: token(ctx) for stem in stems}
    files: dict[str, str | bytes] = {}
    for stem in stems:
        files[f"{folder}/{stem}.txt"] = lines_text([f"owner: {ctx.choice(ctx.vocab.people)}",
                                                    f"token: {tokens[stem]}"])
    if ctx.is_test:
        config = f"{cfg_stem}.ini"
        files[config] = lines_text(["[session]", f"current = {active}", f"retries = {ctx.rng.randint(1, 5)}"])
    else:
        config = f"{cfg_stem}.json"
        files[config] = json.dumps({"active_profile": active, "retries": ctx.rng.randint(1, 5)}, indent=2) + "\n"
    return ctx.task(
        subtype="pointer",
        instruction=ctx.say(POINTER, config=config, dir=folder),
        verifier=AnswerEquals(tokens[active], mode="exact"),
        gold=[Action.run(f"cat {config}"), Action.run(f"cat {folder}/{active}.txt"),
              Action.submit(tokens[active])],
        files=files,
        skills=SKILLS,
        expects_answer=True,
    )


def tier2(ctx: GenContext) -> Task:
    """Read a job config, compute what it asks from the file it names, write where it says."""
    cfg_stem, folder, out_dir, out_stem, *stems = ctx.words(8)
    columns = ("hours", "score") if ctx.is_test else ("units", "weight")
    files: dict[str, str | bytes] = {}
    sums: dict[str, dict[str, int]] = {}
    for stem in stems:
        rows = [(ctx.choice(ctx.vocab.people), ctx.rng.randint(1, 90), ctx.rng.randint(1, 90))
                for _ in range(ctx.rng.randint(4, 9))]
        path = f"{folder}/{stem}.csv"
        files[path] = csv_text(("name", *columns), rows)
        sums[path] = {columns[0]: sum(r[1] for r in rows), columns[1]: sum(r[2] for r in rows)}
    source = ctx.choice(list(sums))
    column = ctx.choice(columns)
    out = f"{out_dir}/{out_stem}.txt"
    total = sums[source][column]
    if ctx.is_test:
        config = f"{cfg_stem}.ini"
        files[config] = lines_text(["[job]", f"input = {source}", f"field = {column}", f"destination = {out}"])
    else:
        config = f"{cfg_stem}.json"
        files[config] = json.dumps({"source": source, "column": column, "output": out}, indent=2) + "\n"
    index = columns.index(column) + 2
    return ctx.task(
        subtype="config_compute",
        instruction=ctx.say(CONFIG_COMPUTE, config=config),
        verifier=FileEquals(out, str(total)),
        gold=[
            Action.run(f"cat {config}"),
            Action.run(f"mkdir -p {out_dir} && awk -F, 'NR > 1 {{ s += ${index} }} END {{ print s }}' {source} > {out}"),
        ],
        files=files,
        skills=(*SKILLS, "config", "data"),
    )


_CHAIN_SCRIPT = """python3 - <<'PY'
import csv, json
ids = set(json.load(open({account_file!r}))["orders"])
picked = [r for r in csv.DictReader(open({orders!r})) if r["order_id"] in ids and r["status"] == {status!r}]
cents = sum(round(float(r["amount"]) * 100) for r in picked)
json.dump({{"user": {user!r}, "orders": len(picked), "total": cents / 100}}, open({out!r}, "w"))
PY"""


def tier3(ctx: GenContext) -> Task:
    """Three dependent lookups (user -> account -> orders) and a computed JSON result."""
    directory_stem, accounts, orders_stem, out_stem = ctx.words(4)
    statuses = ("settled", "voided", "queued") if ctx.is_test else ("paid", "refunded", "pending")
    status = statuses[0]
    people = ctx.sample(ctx.vocab.people, 5)
    user = people[0]
    # disjoint id ranges per split: account files are named after the ids
    account_ids = ctx.sample(range(500, 999) if ctx.is_test else range(100, 499), len(people))
    files: dict[str, str | bytes] = {}
    order_rows: list[tuple[str, str, str]] = []
    next_order = ctx.rng.randint(6000, 8000) if ctx.is_test else ctx.rng.randint(1000, 4000)
    account_orders: dict[int, list[str]] = {}
    for account in account_ids:
        ids = []
        for _ in range(ctx.rng.randint(2, 5)):
            next_order += ctx.rng.randint(1, 9)
            ids.append(f"o{next_order}")
            order_rows.append((f"o{next_order}", money(ctx.rng.randint(500, 20000)), ctx.choice(statuses)))
        account_orders[account] = ids
    user_account = account_ids[0]
    # make sure the user has at least one order of the asked status and one of another
    first = order_rows.index(next(r for r in order_rows if r[0] == account_orders[user_account][0]))
    order_rows[first] = (order_rows[first][0], order_rows[first][1], status)
    ctx.rng.shuffle(order_rows)
    picked = [r for r in order_rows if r[0] in account_orders[user_account] and r[2] == status]
    cents = sum(int(r[1].replace(".", "")) for r in picked)
    mapping = dict(zip(people, account_ids, strict=True))
    if ctx.is_test:
        directory = f"{directory_stem}.csv"
        files[directory] = csv_text(("user", "account"), sorted(mapping.items()))
    else:
        directory = f"{directory_stem}.json"
        files[directory] = json.dumps(mapping, indent=2, sort_keys=True) + "\n"
    for person, account in mapping.items():
        files[f"{accounts}/{account}.json"] = json.dumps(
            {"owner": person, "orders": account_orders[account]}, indent=2) + "\n"
    orders = f"{orders_stem}.csv"
    files[orders] = csv_text(("order_id", "amount", "status"), order_rows)
    out = f"{out_stem}.json"
    account_file = f"{accounts}/{user_account}.json"
    lookup = f"grep -n '{user}' {directory}"
    return ctx.task(
        subtype="account_chain",
        instruction=ctx.say(CHAIN, user=user, directory=directory, accounts=accounts,
                            orders=orders, status=status, out=out),
        verifier=AllOf(checks=(
            JsonField(out, "user", user),
            JsonField(out, "orders", len(picked)),
            JsonField(out, "total", cents / 100, tolerance=0.006),
        )),
        gold=[
            Action.run(lookup),
            Action.run(f"cat {account_file}"),
            Action.run(f"head -n 3 {orders}"),
            Action.run(_CHAIN_SCRIPT.format(account_file=account_file, orders=orders, status=status,
                                            user=user, out=out)),
            Action.run(f"cat {out}"),
        ],
        files=files,
        skills=(*SKILLS, "json", "data"),
    )


_LEDGER_SCRIPT = """python3 - <<'PY'
import csv, json
balances = json.load(open({balances!r}))
rejected = []
for row in csv.DictReader(open({transfers!r})):
    amount = int(row["amount"])
    if balances[row["sender"]] < amount:
        rejected.append(row["id"])
        continue
    balances[row["sender"]] -= amount
    balances[row["receiver"]] += amount
json.dump(balances, open({out!r}, "w"), indent=2)
open({rejected!r}, "w").write("".join(i + "\\n" for i in rejected))
print(len(rejected))
PY"""

_STOCK_SCRIPT = """python3 - <<'PY'
import csv, json
stock = json.load(open({balances!r}))
refused = []
for row in csv.DictReader(open({transfers!r})):
    qty = int(row["qty"])
    if row["kind"] == "in":
        stock[row["item"]] += qty
    elif stock[row["item"]] < qty:
        refused.append(row["id"])
    else:
        stock[row["item"]] -= qty
json.dump(stock, open({out!r}, "w"), indent=2)
open({rejected!r}, "w").write("".join(i + "\\n" for i in refused))
print(len(refused))
PY"""


def _simulate(ctx: GenContext, start: dict[str, int], moves: list[tuple[str, str, str, int]],
              sequential: bool) -> tuple[dict[str, int], list[str]]:
    """Applies moves (id, a, b, amount): train moves a->b; test: a = item, b = in|out."""
    state = dict(start)
    rejected: list[str] = []
    for move_id, a, b, amount in moves:
        if ctx.is_test:
            if b == "in":
                state[a] += amount
            elif (state[a] if sequential else start[a]) < amount:
                rejected.append(move_id)
            else:
                state[a] -= amount
        elif (state[a] if sequential else start[a]) < amount:
            rejected.append(move_id)
        else:
            state[a] -= amount
            state[b] += amount
    return state, rejected


def tier4(ctx: GenContext) -> Task:
    """Sequential state updates with a rejection rule; two output files and an answer."""
    balances_stem, moves_stem, out_stem, rejected_stem = ctx.words(4)
    names = ctx.sample(ctx.vocab.items if ctx.is_test else ctx.vocab.people, 4)
    for _ in range(200):
        start = {name: ctx.rng.randint(0, 12) * 10 for name in names}
        moves: list[tuple[str, str, str, int]] = []
        for n in range(ctx.rng.randint(6, 10)):
            move_id = f"{'r' if ctx.is_test else 't'}{n + 1:02d}"
            if ctx.is_test:
                moves.append((move_id, ctx.choice(names), ctx.choice(("in", "out", "out")),
                              ctx.rng.randint(1, 8) * 5))
            else:
                sender, receiver = ctx.sample(names, 2)
                moves.append((move_id, sender, receiver, ctx.rng.randint(1, 10) * 10))
        final, rejected = _simulate(ctx, start, moves, sequential=True)
        naive_final, naive_rejected = _simulate(ctx, start, moves, sequential=False)
        if rejected and len(rejected) < len(moves) and (naive_rejected != rejected or naive_final != final):
            break
    balances, transfers = f"{balances_stem}.json", f"{moves_stem}.csv"
    out, rejected_path = f"{out_stem}.json", f"{rejected_stem}.txt"
    header = ("id", "item", "kind", "qty") if ctx.is_test else ("id", "sender", "receiver", "amount")
    files: dict[str, str | bytes] = {
        balances: json.dumps(start, indent=2) + "\n",
        transfers: csv_text(header, moves),
        f"{out_stem}_notes.txt": lines_text(filler_lines(ctx, 2)),
    }
    script = (_STOCK_SCRIPT if ctx.is_test else _LEDGER_SCRIPT).format(
        balances=balances, transfers=transfers, out=out, rejected=rejected_path)
    return ctx.task(
        subtype="ledger",
        instruction=ctx.say(LEDGER, balances=balances, transfers=transfers, out=out,
                            rejected=rejected_path),
        verifier=AllOf(checks=(
            JsonField(out, "", final),
            FileEquals(rejected_path, lines_text(rejected)),
            AnswerEquals(str(len(rejected)), mode="number"),
        )),
        gold=[Action.run(f"cat {balances} {transfers}"), Action.run(script),
              Action.run(f"cat {out} {rejected_path}"), Action.submit(str(len(rejected)))],
        files=files,
        skills=(*SKILLS, "simulation", "json"),
        expects_answer=True,
    )


GENERATORS = {1: tier1, 2: tier2, 3: tier3, 4: tier4}
