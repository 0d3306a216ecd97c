"""Serving a run's checkpoint: a LoRA checkpoint is served over its base model without merging
first and samples what the merged model samples; its policy is named after the run and step."""

from __future__ import annotations

import json

import pytest

from serve_helpers import running

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")
peft = pytest.importorskip("peft", reason="peft is installed by `make test`")


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    """A run folder whose one checkpoint holds a LoRA adapter (non-zero, so it changes the
    model) over ``tiny_model``."""
    from harnessrl.rl.checkpoint import save_checkpoint

    run = tmp_path_factory.mktemp("lora") / "my-run"
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    optimizer = torch.optim.SGD([p for p in adapted.parameters() if p.requires_grad], lr=0.1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    save_checkpoint(run, 1, adapted, tokenizer, optimizer, None, {})
    (run / "config.json").write_text(json.dumps({"model": str(tiny_model)}))
    return run


def test_lora_checkpoint_is_served_unmerged_and_samples_what_the_merged_model_does(lora_run, tiny_model):
    from harnessrl.cli.serve import checkpoint_policy
    from harnessrl.policy.base import GenerationRequest, SamplingParams
    from harnessrl.rl.checkpoint import load_checkpoint_policy

    served = checkpoint_policy(str(lora_run))
    merged, _ = load_checkpoint_policy(lora_run)
    assert isinstance(served.model, peft.PeftModel)  # the adapter stays separate
    assert not isinstance(merged.model, peft.PeftModel)
    assert served.name == merged.name == "checkpoint:my-run/step-000001"
    request = GenerationRequest([1, 2, 3, 4], SamplingParams(1.0, 1.0, 12, (), seed=5))
    [unmerged_answer] = served.generate([request])
    [merged_answer] = merged.generate([request])
    assert unmerged_answer.token_ids == merged_answer.token_ids
    assert unmerged_answer.logprobs == pytest.approx(merged_answer.logprobs, abs=1e-4)
    from harnessrl.policy.hf import HFPolicy

    base_logprobs = HFPolicy(tiny_model, device="cpu").score(request.prompt_ids, unmerged_answer.token_ids)
    assert base_logprobs != pytest.approx(unmerged_answer.logprobs, abs=1e-3)  # the adapter is applied
    with running(served) as (server, _, recorder):
        import httpx

        reply = httpx.post(server.base_url + "/s/lora/v1/chat/completions", timeout=60,
                           json={"max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
        assert recorder.to_trajectory("lora").policy == "checkpoint:my-run/step-000001"
