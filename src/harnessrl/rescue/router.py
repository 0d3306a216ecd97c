"""The adaptive harness router (Harness-S): which K siblings rescue a task, decided before it runs.

A router ranks the members of a sibling pool for one task and returns the Top-K. Every router
ranks before any rescue rollout runs (the paper's routing must choose without seeing outcomes):

- ``validation``: each sibling's success on paired validation tasks minus H0's on the same
  tasks (H0 is the group's own harness), optionally per task family; Top-K by that margin, ties broken by the seed.
- ``profile``: behaviour profiles P_i = {prefer, avoid} per sibling, and several voters (LLMs)
  that each rank the siblings for the task; rank r gets weight ``VOTE_WEIGHTS[r]`` (1, 3/4,
  1/2, 1/4 for the first four places, 0 after), summed over voters; Top-K (paper, eq. 11).
- ``random``: K siblings drawn uniformly (the paper's routing ablation, Table 2).

Routers are deterministic functions of (their state, the task, the seed), and their state
round-trips through ``state_dict`` / ``load_state_dict`` so a resumed run routes exactly as an
uninterrupted one. Re-anchoring (``Router.anchor``, with the `Evidence` of a paired validation)
replaces a router's evidence with a newer measurement, because a sibling's value drifts as the
policy learns (the paper's nonstationarity: H1's +15 over H0 fell to -4). Every caller (the
trainer's rescue, ``harnessrl eval --route``, Rank-1 routing) talks to a router through the
`Router` protocol only; `rescue.routing.make_router` builds one from its name.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harnessrl.rollout.groups import TaskInfo
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

__all__ = ["ROUTERS", "VOTE_WEIGHTS", "Evidence", "PairedValidation", "Router", "TaskInfo"]

VOTE_WEIGHTS: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)
ROUTERS: tuple[str, ...] = ("validation", "profile", "random")  # TrainConfig.router


@dataclass
class Evidence:
    """A paired validation, as a router is anchored on it: the outcomes (`PairedValidation`),
    the runs themselves (harness -> task id -> trajectory; profile writers read them), the
    validation tasks, and each group harness H0 with its siblings."""

    record: PairedValidation
    runs: Mapping[str, Mapping[str, Trajectory]]
    tasks: Sequence[Task]
    siblings: Mapping[str, Sequence[str]]


class Router(Protocol):
    """Ranks sibling names for a task; ``route`` returns the Top-``k``. ``anchored``: whether
    it ranks on paired-validation evidence (then ``anchor`` is due before the first rescue and
    at every re-anchor)."""

    name: str
    anchored: bool

    def rank(self, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> list[str]:
        """Returns every sibling of ``h0``, best first."""
        ...

    def route(self, task: TaskInfo, h0: str, siblings: Sequence[str], k: int, seed: int) -> list[str]:
        """Returns the ``k`` best siblings (all of them when there are fewer)."""
        ...

    def beats_h0(self, task: TaskInfo, h0: str, sibling: str) -> bool:
        """Whether ``sibling`` is expected to do better than ``h0`` itself on ``task`` (Rank-1
        routing keeps H0 otherwise)."""
        ...

    def anchor(self, evidence: Evidence) -> dict[str, Any]:
        """Replaces the router's evidence with ``evidence``; returns a JSON summary of it."""
        ...

    def report(self, h0: str) -> dict[str, Any]:
        """Returns what the router holds about ``h0``'s siblings, for a routing report."""
        ...

    def metrics(self) -> dict[str, float]:
        """Returns the router's running counts (``router_`` metrics of the trainer)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Returns the router's state as JSON-serializable data."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what ``state_dict`` returned."""
        ...


def top_k_by_score(scores: Mapping[str, float], siblings: Sequence[str], seed: int | str) -> list[str]:
    """Returns ``siblings`` sorted by descending score; equal scores are ordered by a shuffle
    drawn from ``seed`` (so ties do not always favour the same sibling). A sibling missing
    from ``scores`` scores 0."""
    rng = random.Random(seed)
    tiebreak = {name: rng.random() for name in sorted(siblings)}
    return sorted(siblings, key=lambda name: (-float(scores.get(name, 0.0)), tiebreak[name]))


class _RankingRouter:
    name = "router"
    anchored = False

    def rank(self, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> list[str]:
        raise NotImplementedError

    def beats_h0(self, task: TaskInfo, h0: str, sibling: str) -> bool:
        return True

    def anchor(self, evidence: Evidence) -> dict[str, Any]:
        return {}

    def report(self, h0: str) -> dict[str, Any]:
        return {}

    def metrics(self) -> dict[str, float]:
        return {}

    def route(self, task: TaskInfo, h0: str, siblings: Sequence[str], k: int, seed: int) -> list[str]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self.rank(task, h0, siblings, seed)[:k]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


class RandomRouter(_RankingRouter):
    """K siblings drawn uniformly with the seed (no evidence used)."""

    name = "random"

    def rank(self, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> list[str]:
        order = sorted(siblings)
        random.Random(f"{seed}:{task.task_id}").shuffle(order)
        return order


@dataclass
class PairedValidation:
    """Paired validation outcomes: per harness (H0s and siblings alike), per task id, whether
    it was solved; the family of each task; and the update step the policy had when this was
    measured. Pairing is by task: a margin compares two harnesses on the tasks both ran."""

    outcomes: dict[str, dict[str, bool]] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)
    step: int = 0

    def margin(self, sibling: str, h0: str, family: str | None = None) -> float | None:
        """Returns the sibling's success rate minus ``h0``'s over the tasks both ran (of one
        family when given); None when they share no such task."""
        mine, base = self.outcomes.get(sibling, {}), self.outcomes.get(h0, {})
        tasks = [t for t in mine if t in base and (family is None or self.families.get(t) == family)]
        if not tasks:
            return None
        return (sum(mine[t] for t in tasks) - sum(base[t] for t in tasks)) / len(tasks)

    def margins(self, h0: str) -> dict[str, float]:
        """Returns every other harness's margin over ``h0`` (those without shared tasks left out)."""
        out = {}
        for name in self.outcomes:
            m = self.margin(name, h0) if name != h0 else None
            if m is not None:
                out[name] = m
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"outcomes": self.outcomes, "families": self.families, "step": self.step}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairedValidation:
        return cls(
            outcomes={str(h): {str(k): bool(v) for k, v in o.items()} for h, o in data.get("outcomes", {}).items()},
            families={str(k): str(v) for k, v in data.get("families", {}).items()},
            step=int(data.get("step", 0)),
        )


class ValidationRouter(_RankingRouter):
    """Top-K by paired validation margin over the group's H0, per task family when
    ``per_family`` and the family has evidence (else overall). Every ``anchor`` call replaces
    the evidence; ``history`` keeps each anchor's margins over the H0s named in ``track`` (the
    nonstationarity the paper reports is read from it)."""

    name = "validation"
    anchored = True

    def __init__(self, record: PairedValidation | None = None, per_family: bool = False,
                 track: Sequence[str] = ()) -> None:
        self.record = record or PairedValidation()
        self.per_family = per_family
        self.track = list(track)
        self.history: list[dict[str, Any]] = []
        if record is not None:
            self._remember(record)

    def _remember(self, record: PairedValidation) -> None:
        self.history.append({"step": record.step, "margins": {h0: record.margins(h0) for h0 in self.track}})

    def set_record(self, record: PairedValidation) -> None:
        """Replaces the validation evidence (a re-anchor) and records its margins."""
        self.record = record
        self._remember(record)

    def anchor(self, evidence: Evidence) -> dict[str, Any]:
        self.set_record(evidence.record)
        return {"margins": self.history[-1]["margins"]}

    def beats_h0(self, task: TaskInfo, h0: str, sibling: str) -> bool:
        """Validation routing scores H0 at 0 against itself: a sibling must have a positive margin."""
        return self.scores(task, h0, [sibling])[sibling] > 0.0

    def report(self, h0: str) -> dict[str, Any]:
        return {"validation_margins": self.record.margins(h0)}

    def scores(self, task: TaskInfo, h0: str, siblings: Sequence[str]) -> dict[str, float]:
        """Returns each sibling's margin over ``h0`` for this task (0 without evidence)."""
        out: dict[str, float] = {}
        for name in siblings:
            margin = self.record.margin(name, h0, task.family) if self.per_family and task.family else None
            if margin is None:
                margin = self.record.margin(name, h0)
            out[name] = 0.0 if margin is None else margin
        return out

    def rank(self, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> list[str]:
        return top_k_by_score(self.scores(task, h0, siblings), siblings, f"{seed}:{task.task_id}")

    def state_dict(self) -> dict[str, Any]:
        return {"record": self.record.to_dict(), "per_family": self.per_family, "track": self.track,
                "history": self.history}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.record = PairedValidation.from_dict(state.get("record", {}))
        self.per_family = bool(state.get("per_family", self.per_family))
        self.track = list(state.get("track", self.track))
        self.history = list(state.get("history", []))


def aggregate_votes(
    rankings: Sequence[Sequence[str]], siblings: Sequence[str], weights: Sequence[float] = VOTE_WEIGHTS
) -> dict[str, float]:
    """Returns each sibling's summed rank weight over the voters' rankings (eq. 11): a voter's
    first place adds ``weights[0]``, its second ``weights[1]``, ...; places past the weights add
    0; names that are not siblings and repeats within one ranking are ignored."""
    known = set(siblings)
    scores = {name: 0.0 for name in siblings}
    for ranking in rankings:
        seen: set[str] = set()
        place = 0
        for name in ranking:
            if name not in known or name in seen:
                continue
            seen.add(name)
            if place < len(weights):
                scores[name] += float(weights[place])
            place += 1
    return scores


# A voter: given the task and the siblings with their profiles (relative to H0), returns a
# ranking (names, best first), or raises ``ValueError`` for an answer it could not read
# (counted, then ignored).
Voter = Callable[[TaskInfo, Mapping[str, Mapping[str, Any]]], list[str]]


class ProfileRouter(_RankingRouter):
    """Voters rank the siblings from their behaviour profiles; weighted votes pick the Top-K.

    ``profiles`` maps a group harness H0 to its siblings' profiles, each ``{"prefer": [{"when",
    "behavior"}...], "avoid": [...]}`` relative to that H0 (``anchor`` replaces them; the
    writer is ``rescue.profiles.ProfileWriter``). A voter that fails or answers garbage is
    counted in ``malformed_votes`` and ignored; when every voter fails the ranking falls back
    to the seed's tie order (all scores 0).
    """

    name = "profile"
    anchored = True

    def __init__(self, voters: Sequence[Voter], profiles: Mapping[str, Mapping[str, Any]] | None = None,
                 weights: Sequence[float] = VOTE_WEIGHTS, writer: Any = None) -> None:
        if not voters:
            raise ValueError(
                "profile routing needs at least one voter (an OpenAI-compatible endpoint, MODEL@URL); "
                "configure one, or use router 'validation' or 'random'"
            )
        self.voters = list(voters)
        self.profiles: dict[str, dict[str, Any]] = {h0: dict(p) for h0, p in (profiles or {}).items()}
        self.weights = tuple(weights)
        self.malformed_votes = 0
        self.votes = 0
        self.anchored_at: list[int] = []
        self.writer = writer  # a rescue.profiles.ProfileWriter: writes the profiles at each anchor

    def set_profiles(self, profiles: Mapping[str, Mapping[str, Any]], step: int) -> None:
        """Replaces the profiles (per H0: sibling -> profile) with ones written at ``step``."""
        self.profiles = {h0: dict(p) for h0, p in profiles.items()}
        self.anchored_at.append(step)

    def anchor(self, evidence: Evidence) -> dict[str, Any]:
        """Has the writer profile each H0's siblings from their paired runs (without a writer
        the profiles stay as they are)."""
        if self.writer is None:
            return {}
        profiles = {}
        for h0, siblings in evidence.siblings.items():
            wanted = {h0, *siblings}
            runs = {name: r for name, r in evidence.runs.items() if name in wanted}
            profiles[h0] = self.writer.profiles(h0, runs, evidence.tasks)
        self.set_profiles(profiles, evidence.record.step)
        return {"margins": {h0: evidence.record.margins(h0) for h0 in evidence.siblings},
                "profiles_dropped": self.writer.dropped}

    def report(self, h0: str) -> dict[str, Any]:
        votes = {"asked": self.votes, "malformed": self.malformed_votes}
        if self.writer is not None:
            votes.update(profiles_written=self.writer.answers, profiles_malformed=self.writer.dropped)
        return {"profiles": self.profiles.get(h0, {}), "votes": votes}

    def metrics(self) -> dict[str, float]:
        return {"votes": float(self.votes), "malformed_votes": float(self.malformed_votes)}

    def rank(self, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> list[str]:
        known = self.profiles.get(h0, {})
        shown = {name: known.get(name, {"prefer": [], "avoid": []}) for name in siblings}
        rankings: list[list[str]] = []
        for voter in self.voters:
            self.votes += 1
            try:
                rankings.append(list(voter(task, shown)))
            except (ValueError, KeyError, TypeError, OSError):
                self.malformed_votes += 1
        scores = aggregate_votes(rankings, siblings, self.weights)
        return top_k_by_score(scores, siblings, f"{seed}:{task.task_id}")

    def state_dict(self) -> dict[str, Any]:
        return {"profiles": self.profiles, "malformed_votes": self.malformed_votes, "votes": self.votes,
                "anchored_at": self.anchored_at}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.profiles = {h0: dict(p) for h0, p in state.get("profiles", {}).items()}
        self.malformed_votes = int(state.get("malformed_votes", 0))
        self.votes = int(state.get("votes", 0))
        self.anchored_at = list(state.get("anchored_at", []))
