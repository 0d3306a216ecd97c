"""Building a router from its name: the one place where ``validation``, ``profile`` and
``random`` become `rescue.router` objects (the trainer's rescue and ``harnessrl eval --route``
both call `make_router`)."""

from __future__ import annotations

from collections.abc import Sequence

from harnessrl.rescue.profiles import ProfileWriter, client_from_spec, llm_voter, require_reachable
from harnessrl.rescue.router import ROUTERS, ProfileRouter, RandomRouter, Router, ValidationRouter


def make_router(
    name: str, *, seed: int = 0, track: Sequence[str] = (), per_family: bool = False,
    voters: Sequence[str] = (), writer: str | None = None, check_endpoints: bool = True,
) -> Router:
    """Returns router ``name`` (`ROUTERS`). ``validation``: margins tracked for the H0s in
    ``track``, per task family when ``per_family``. ``profile``: one LLM voter per
    ``voters`` spec (MODEL@URL; voter i samples with seed ``seed + i``) and a profile writer
    (``writer``, default the first voter), every endpoint checked reachable first unless
    ``check_endpoints`` is off, so an unreachable one stops a run before any rollout."""
    if name == "validation":
        return ValidationRouter(per_family=per_family, track=track)
    if name == "profile":
        if not voters:
            raise ValueError("profile routing needs at least one voter (an OpenAI-compatible endpoint, MODEL@URL, "
                             "e.g. `harnessrl serve` of a local model); or use router 'validation' or 'random'")
        clients = [client_from_spec(spec) for spec in voters]
        writing = client_from_spec(writer) if writer else clients[0]
        for client in {c.endpoint: c for c in [*clients, writing]}.values() if check_endpoints else ():
            require_reachable(client)
        return ProfileRouter([llm_voter(c, seed=seed + i) for i, c in enumerate(clients)], writer=ProfileWriter(writing))
    if name == "random":
        return RandomRouter()
    raise ValueError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}")
