"""External (out-of-space) agents: real programs run against `harnessrl serve` on our tasks.

mini-swe-agent, Claude Code, Codex CLI, opencode and OpenClaw are installed into harnessrl's
cache (`install`), configured and started inside the sandbox on a task's workspace with only
loopback networking, pointed at `harnessrl serve` through a relay (`relay`), and scored by the
task's verifier afterwards (`run`). ``ext:<name>`` names them as evaluation configurations.
"""

EXTERNAL_PREFIX = "ext:"
"""How an external agent is named as an evaluation configuration or a ``rollout_through``:
``ext:<name>`` (the one definition; evaluation, black-box training and the config use it)."""


def external_agent_names() -> list[str]:
    """Returns the names of the external agents harnessrl knows (``ext:<name>`` in evaluation);
    whether one is installed is checked when it runs (`harnessrl external install NAME`)."""
    from harnessrl.external.agents import AGENTS

    return list(AGENTS)
