"""The harness contract: messages, tool calls and outputs, and the five component interfaces.

A harness is five components, one per factor of the space (system prompt, tool interface,
observation, context management, workflow). Each component is data plus a small class;
``harness/registry.py`` maps (factor letter, level) to a component so the space is built
from what is registered. ``EpisodeHooks`` are the two points of the episode no component
sees (the opening, and a proposed call before it runs); in-space harnesses leave them empty,
sibling harnesses (``harness/siblings``) fill them, and a factor registered beyond the five
acts through them: its realizations are ``FactorHooks``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

# The span labels belong to the token-level record; harness authors find them here too.
from harnessrl.trajectory import (  # noqa: F401 - re-exported for harness authors
    SPAN_FORMAT,
    SPAN_KINDS,
    SPAN_OBSERVATION,
    SPAN_POLICY,
    SPAN_REMINDER,
    SPAN_SUMMARY,
    SPAN_SYSTEM,
    SPAN_TASK,
)

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action, Task

Role = Literal["system", "user", "assistant"]


@dataclass
class Message:
    """One chat message with the span label of its content.

    ``token_ids`` is set on policy messages: the exact ids the policy sampled, which are
    reused verbatim whenever the message is rendered again (never re-tokenized).
    ``pinned`` messages survive every context policy (the task, a W1 plan).
    """

    role: Role
    content: str
    span: str
    token_ids: tuple[int, ...] | None = None
    turn: int = -1
    pinned: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the policy sees it: name, description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """Returns the tool in OpenAI function-calling form."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """A parsed request to run one tool with arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedOutput:
    """The policy's output as the tool interface understood it.

    ``error`` is a model-facing message when the output could not be understood (no action,
    two actions where one is allowed, malformed call, unknown tool, wrong arguments); then
    ``calls`` is empty and the harness shows the error as an observation.
    """

    calls: tuple[ToolCall, ...] = ()
    error: str | None = None
    thought: str = ""
    error_kind: str | None = None  # "format" (unparseable) or "tool" (unknown tool / bad args)


@dataclass(frozen=True)
class ToolOutput:
    """The result of one tool call, before the observation format renders it."""

    tool: str
    output: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_s: float = 0.0
    truncated: bool = False
    timed_out: bool = False
    is_error: bool = False  # the call itself failed (refused path, bad arguments, missing file)
    submitted: str | None = None  # set when the call is the submit action: the answer
    changed_paths: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """Returns whether the call failed (tool error, non-zero exit code or timeout)."""
        return self.is_error or self.timed_out or (self.exit_code not in (None, 0))


@dataclass
class PromptContext:
    """What a system prompt needs to render: the task and the tool interface it documents."""

    task: Task
    tools: ToolInterface
    workflow: Workflow
    max_turns: int


@dataclass
class EpisodeState:
    """The mutable state of one episode that components may read (and workflows update)."""

    task: Task
    max_turns: int = 30
    turn: int = 0
    submits: int = 0
    answer: str | None = None
    plan: str | None = None
    commands: list[str] = field(default_factory=list)
    changed_paths: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    last_failed: bool = False
    format_errors: int = 0
    consecutive_format_errors: int = 0
    tool_errors: int = 0
    blocked_calls: int = 0  # proposed calls a harness rule refused to run


def describe_call(call: ToolCall) -> str:
    """Returns a one-line description of a call, ``name key='value', ...`` (arguments cut
    short): what ``EpisodeState.commands`` records, so equal calls have equal lines."""
    text = ", ".join(f"{k}={str(v)[:80]!r}" for k, v in call.arguments.items())
    return f"{call.name} {text[:200]}"


class Component(ABC):  # noqa: B024 - subclasses declare the abstract methods
    """A realization of one factor level. Subclasses set ``letter``, ``level`` and ``name``."""

    letter: ClassVar[str] = ""
    level: ClassVar[int] = -1
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    out_of_space: ClassVar[bool] = False


class SystemPrompt(Component):
    """Factor S: the system message, the first user message, and mid-conversation reminders."""

    letter = "S"

    @abstractmethod
    def system_message(self, ctx: PromptContext) -> str:
        """Returns the system message."""

    @abstractmethod
    def first_user_message(self, ctx: PromptContext) -> str:
        """Returns the first user message (the task, and whatever this style puts with it)."""

    def reminder(self, state: EpisodeState) -> str | None:
        """Returns a reminder to inject after this turn's observation, or None."""
        return None


class ToolInterface(Component):
    """Factor T: the tools, their call syntax, parsing, execution and the oracle's rendering."""

    letter = "T"
    submit_tool: ClassVar[str] = "submit"

    @abstractmethod
    def specs(self) -> list[ToolSpec]:
        """Returns the tools this interface offers (submit included)."""

    @abstractmethod
    def usage(self) -> str:
        """Returns the instructions that teach the call syntax (for system prompts)."""

    @abstractmethod
    def example(self) -> str:
        """Returns one well-formed example response in this syntax."""

    @abstractmethod
    def parse(self, text: str) -> ParsedOutput:
        """Returns the calls in the policy's text, or a model-facing error. Never raises."""

    @abstractmethod
    def execute(self, call: ToolCall, sandbox: Sandbox) -> ToolOutput:
        """Runs one parsed call in the sandbox. Never raises for bad arguments or paths."""

    @abstractmethod
    def render(self, action: Action, thought: str = "") -> str:
        """Returns policy text in this syntax that performs the abstract ``action``."""


class ObservationFormat(Component):
    """Factor O: how tool output and error notices are shown to the policy."""

    letter = "O"

    @abstractmethod
    def format(self, output: ToolOutput) -> str:
        """Returns the observation text of one tool output."""

    @abstractmethod
    def format_error(self, message: str, kind: str = "format") -> str:
        """Returns an error observation (bad tool call, workflow violation) in this style."""


TokenCounter = Callable[[str], int]


class ContextPolicy(Component):
    """Factor C: which messages the policy sees at each turn."""

    letter = "C"

    @abstractmethod
    def apply(
        self, messages: Sequence[Message], state: EpisodeState, count_tokens: TokenCounter, budget: int
    ) -> list[Message]:
        """Returns the messages to render for the next turn (the history itself is not changed)."""


@dataclass(frozen=True)
class SubmitDecision:
    """What a workflow says about a submit: end the episode, or show ``message`` and go on."""

    done: bool
    message: str | None = None


class Workflow(Component):
    """Factor W: the control loop around actions (plan first, review before the final submit)."""

    letter = "W"

    def instructions(self) -> str:
        """Returns workflow instructions appended to the first user message."""
        return ""

    def wants_plan(self, state: EpisodeState) -> bool:
        """Returns whether this turn must be a plan rather than an action."""
        return False

    def after_step(self, state: EpisodeState, outputs: Sequence[ToolOutput]) -> list[str]:
        """Returns reminders to inject after a step's observations."""
        return []

    def on_submit(self, state: EpisodeState, sandbox: Sandbox) -> SubmitDecision:
        """Returns whether a submit ends the episode."""
        return SubmitDecision(done=True)


@dataclass(frozen=True)
class CallVerdict:
    """What harness rules say about a proposed call: ``blocked`` is the reason shown as its
    observation instead of running it (None: it runs); ``hints`` are shown after the step."""

    blocked: str | None = None
    hints: tuple[str, ...] = ()


class EpisodeHooks:
    """Harness behaviour at points no factor component sees. The default does nothing."""

    def at_start(self, state: EpisodeState, sandbox: Sandbox) -> list[str]:
        """Returns messages shown after the task, before the first turn (may run read-only
        commands in the episode's sandbox)."""
        return []

    def before_call(self, call: ToolCall, state: EpisodeState) -> CallVerdict:
        """Returns whether a parsed call may run, and hints to show after it."""
        return CallVerdict()


class FactorHooks(Component, EpisodeHooks):
    """A realization of a factor beyond the five (``registry.register_factor``): it acts at the
    episode's hook points, the opening and each proposed call. Subclasses set ``letter``,
    ``level`` and ``name`` and override ``at_start`` / ``before_call``."""


class ChainedHooks(EpisodeHooks):
    """Several hooks in order: every start message, every hint; the first block stops the call."""

    def __init__(self, hooks: Sequence[EpisodeHooks]) -> None:
        self.hooks = list(hooks)

    def at_start(self, state: EpisodeState, sandbox: Sandbox) -> list[str]:
        return [message for hook in self.hooks for message in hook.at_start(state, sandbox)]

    def before_call(self, call: ToolCall, state: EpisodeState) -> CallVerdict:
        hints: list[str] = []
        for hook in self.hooks:
            verdict = hook.before_call(call, state)
            hints += verdict.hints
            if verdict.blocked is not None:
                return CallVerdict(verdict.blocked, tuple(hints))
        return CallVerdict(None, tuple(hints))


def encodable(text: str) -> str:
    """Returns ``text`` with what UTF-8 cannot encode (lone surrogates from undecodable file
    bytes or JSON escapes) replaced, so an observation can always be tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:  # bytes read with surrogateescape come back as U+FFFD, like a UTF-8 terminal shows
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "replace").decode("utf-8")
    return text
