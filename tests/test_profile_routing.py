"""Profile routing over real HTTP: `harnessrl serve`'s app runs a scripted policy that writes
known behaviour profiles and ranks siblings; malformed answers are counted and dropped."""

import json

import pytest

from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rescue.profiles import ProfileWriter, client_from_spec, llm_voter, require_reachable
from harnessrl.rescue.rank1 import paired_validation, run_with
from harnessrl.rescue.router import ProfileRouter, TaskInfo
from harnessrl.rl.config import TrainConfig
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import load_suite
from serve_helpers import Scripted, running

H0 = "S0-T0-O0-C0-W0"
SIBLINGS = ["S1-T0-O0-C0-W0", "S0-T2-O0-C0-W0", "S0-T0-O1-C0-W0"]
LIMITS = HarnessLimits(max_turns=8, max_new_tokens=16_384, context_tokens=262_144)


def answer(context):
    prompt = context.messages[-1]["content"]
    if "Describe WHEN" in prompt:
        sibling = prompt.split("Describe WHEN the sibling", 1)[1].split()[1]
        return json.dumps({"prefer": [{"when": "file tasks", "behavior": f"{sibling} reads before writing"}],
                           "avoid": []})
    if "Rank the candidate harnesses" in prompt:
        assert "reads before writing" in prompt  # the voter saw the profiles
        return "```json\n" + json.dumps({"ranking": ["S0-T2-O0-C0-W0", "not-a-sibling", "S1-T0-O0-C0-W0"]}) + "\n```"
    return "?"


def test_profiles_are_written_from_paired_runs_and_votes_pick_the_top_k_over_http():
    tasks = list(load_suite("workspace").tasks("train", limit=2, seed=0))
    runs = {}
    settings = RolloutSettings(LIMITS, backend="auto")
    record = paired_validation(run_with(OraclePolicy(), settings), lambda n: Harness.named(n, LIMITS),
                               [H0, *SIBLINGS], tasks, lambda i: i, keep=runs)
    assert set(runs) == {H0, *SIBLINGS} and all(set(r) == {t.id for t in tasks} for r in runs.values())
    assert record.margin(SIBLINGS[0], H0) == 0.0  # the oracle passes everywhere
    with running(Scripted(answer)) as (server, policy, _):
        writer = ProfileWriter(client_from_spec(f"writer@{server.base_url}"))
        profiles = writer.profiles(H0, runs, tasks)
        voters = [llm_voter(client_from_spec(f"voter@{server.base_url}"), seed=s) for s in (0, 1)]
        router = ProfileRouter(voters)
        router.set_profiles({H0: profiles}, step=0)
        top = router.route(TaskInfo(tasks[0].id, "files", tasks[0].instruction), H0, SIBLINGS, 2, seed=0)
    assert writer.answers == 3 and writer.dropped == 0
    assert profiles["S1-T0-O0-C0-W0"]["prefer"][0]["behavior"] == "S1-T0-O0-C0-W0 reads before writing"
    assert top == ["S0-T2-O0-C0-W0", "S1-T0-O0-C0-W0"]  # both voters: 1 + 1 vs 3/4 + 3/4 (the bogus name skipped)
    assert router.votes == 2 and router.malformed_votes == 0
    seeds = [c.raw.get("seed") for c in policy.contexts if "Rank the candidate" in c.messages[-1]["content"]]
    assert seeds == [0, 1]


def test_garbage_profiles_and_votes_are_counted_never_a_crash():
    with running(Scripted(lambda context: "no json here")) as (server, _, _):
        writer = ProfileWriter(client_from_spec(f"writer@{server.base_url}"))
        tasks = list(load_suite("workspace").tasks("train", limit=1, seed=0))
        assert writer.profile(SIBLINGS[0], H0, []) == {"prefer": [], "avoid": []}
        router = ProfileRouter([llm_voter(client_from_spec(f"voter@{server.base_url}"))])
        ranking = router.route(TaskInfo(tasks[0].id), H0, SIBLINGS, 3, seed=0)
        require_reachable(client_from_spec(f"m@{server.base_url}"))  # the served app answers /v1/models
    assert writer.dropped == 1 and router.malformed_votes == 1 and sorted(ranking) == sorted(SIBLINGS)
    with pytest.raises(ValueError, match="expected MODEL@URL"):
        client_from_spec("http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="does not answer"):
        require_reachable(client_from_spec("m@http://127.0.0.1:9"), timeout_s=2)


def test_profile_routing_without_voters_refuses_to_start():
    with pytest.raises(ValueError, match="router 'profile' needs profile_voters"):
        TrainConfig(rescue="siblings", router="profile")
    assert TrainConfig(rescue="siblings", router="profile", profile_voters=["m@http://127.0.0.1:1"]).router == "profile"


def test_eval_route_over_a_pool_folder_with_profile_voters_over_http(tmp_path, capsys):
    """`eval --route pool:DIR --router profile`: the pool's members are the candidates, the
    profiles are written and the votes cast over HTTP, and the voted member is Rank-1."""
    from harnessrl.cli import main
    from harnessrl.rescue.pool import Pool

    folder = tmp_path / "pool"
    assert main(["pool", "from-space", "--base", H0, "--out", str(folder)]) == 0
    pool = Pool.load(folder)
    chosen = pool.member_name(pool.ids[3])

    def respond(context):
        prompt = context.messages[-1]["content"]
        if "Describe WHEN" in prompt:
            return json.dumps({"prefer": [{"when": "file tasks", "behavior": "reads first"}], "avoid": []})
        if "Rank the candidate harnesses" in prompt:
            assert chosen in prompt  # the voter is shown the pool's members by name
            return json.dumps({"ranking": [chosen]})
        return "?"

    out = tmp_path / "route"
    with running(Scripted(respond)) as (server, _, _):
        assert main(["eval", "--policy", "oracle", "--route", f"pool:{folder}", "--router", "profile",
                     "--route-voter", f"voter@{server.base_url}", "--limit", "2", "--route-validation", "1",
                     "--out", str(out)]) == 0
    result = json.loads((out / "routing.json").read_text())
    assert result["h0"] == pool.member_name("H0") and len(result["siblings"]) == len(pool) - 1 == 10
    assert set(result["choice"].values()) == {chosen} and result["h0_rank1_share"] == 0.0
    assert result["votes"] == {"asked": 2, "malformed": 0, "profiles_written": 10, "profiles_malformed": 0}
    assert result["under_h0"]["pass_at_1"] == 1.0 == result["under_rank1"]["pass_at_1"]  # the oracle passes
    # the same folder without pool: routes over the same members
    from harnessrl.cli.eval import route_members

    assert route_members(str(folder)) == route_members(f"pool:{folder}")
    with pytest.raises(ValueError, match="nor a pool folder"):
        route_members(str(tmp_path / "nothing-here"))
    capsys.readouterr()
    assert main(["eval", "--policy", "oracle", "--route", f"pool:{folder}", "--router", "profile", "--limit", "1"]) != 0
    assert "--router profile needs at least one voter: --route-voter MODEL@URL" in capsys.readouterr().err


def test_eval_route_with_the_validation_router_keeps_h0_without_a_positive_margin(tmp_path):
    """`eval --route H0 --router validation`: the paired validation anchors the router, its
    margins are in the report, and a sibling that only ties H0 (the oracle passes under every
    harness) is never Rank-1."""
    from harnessrl.cli import main

    out = tmp_path / "route"
    assert main(["eval", "--policy", "oracle", "--route", H0, "--router", "validation", "--limit", "2",
                 "--route-validation", "1", "--out", str(out)]) == 0
    result = json.loads((out / "routing.json").read_text())
    assert result["validation_margins"] and set(result["validation_margins"]) == set(result["siblings"])
    assert set(result["validation_margins"].values()) == {0.0}
    assert result["h0_rank1_share"] == 1.0 and set(result["choice"].values()) == {H0}
    assert result["meta"]["validation_episodes"] == 1 + len(result["siblings"])
