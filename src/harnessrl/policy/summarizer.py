"""C2 compaction's policy-written digest: ``PolicySummarizer`` implements the harness's ``Summarizer`` with a policy."""

from __future__ import annotations

from collections.abc import Sequence

from harnessrl.harness.base import SPAN_SUMMARY, EpisodeState, Message
from harnessrl.harness.context import Summarizer, deterministic_digest
from harnessrl.policy.base import GenerationRequest, Policy, SamplingParams

SUMMARY_INSTRUCTION = (
    "You write the working memory of a software agent. Summarize the conversation below in a "
    "few short lines: what was done, which files changed, which errors occurred, and what is "
    "left to do. Keep exact file names, values and answers."
)


class PolicySummarizer:
    """C2's option: the policy writes the digest instead of the deterministic one (give it to
    ``Harness.with_summarizer``).

    The summary is sampled greedily and is not trained on (it is harness-injected text in the
    next prompt). A summary is asked for once per set of dropped turns; an empty or failed
    generation falls back to the deterministic digest.
    """

    def __init__(self, policy: Policy, max_new_tokens: int = 256, fallback: Summarizer = deterministic_digest) -> None:
        self.policy, self.max_new_tokens, self.fallback = policy, max_new_tokens, fallback
        self._memo: dict[tuple[int, ...], str] = {}

    def __call__(self, dropped: Sequence[Message], state: EpisodeState) -> str:
        key = tuple(sorted({m.turn for m in dropped}))
        if key in self._memo:
            return self._memo[key]
        transcript = "\n".join(f"[{m.role}] {m.content[:2000]}" for m in dropped)
        tokenizer = self.policy.tokenizer
        prompt = tokenizer.render(
            [Message("system", SUMMARY_INSTRUCTION, SPAN_SUMMARY), Message("user", transcript, SPAN_SUMMARY)]
        )
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=tokenizer.stop_token_ids)
        generation = self.policy.generate([GenerationRequest(prompt.ids, params)])[0]
        text = tokenizer.decode([i for i in generation.token_ids if i not in tokenizer.stop_token_ids]).strip()
        if generation.finish_reason == "error" or not text:
            return self.fallback(dropped, state)
        summary = self._memo[key] = f"[Summary of earlier turns, written by the agent]\n{text}"
        return summary
