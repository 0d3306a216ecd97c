"""The run configuration of `harnessrl train`: every knob a documented, validated field.

Presets: ``quick`` (the default: minutes on a 2-core CPU with the embedded model) and
``paper`` (the Harness Scaling protocol: GRPO, 16 tasks x 8 rollouts per step, K=2
neighbour pairing over the OA(18) design, 300 steps; the Harness Scaling paper).
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harnessrl.external import EXTERNAL_PREFIX
from harnessrl.harness.limits import DEFAULT_MAX_NEW_TOKENS, HarnessLimits
from harnessrl.rescue.sibling_source import SiblingSource
from harnessrl.rollout.engine import EngineOptions
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.sandbox import BACKENDS

# The names `policy/hf.py` resolves (importing it here would import torch with the config).
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
# The design kinds `harnessrl.design.make_design` builds (its DESIGN_KINDS; a test checks they agree).
DesignName = Literal["orthogonal", "first-order", "random", "full", "single"]


class TrainConfig(BaseModel):
    """Everything a training run needs; unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- what to train ------------------------------------------------------------------------
    model: str = Field("embedded", description="model: 'embedded' (SmolLM2-135M-Instruct) or a local HF folder")
    device: str = Field("auto", description="torch device: auto, cpu, cuda")
    dtype: str = Field(
        "auto",
        description="rollout dtype: auto (bf16 on GPU and on CPUs with native bf16 (AMX, AVX512-BF16), else fp32), "
        "float32, bfloat16; full fine-tuning keeps fp32 master weights and updates under autocast in this dtype",
    )
    lora_rank: int = Field(0, ge=0, description="LoRA rank (0 = full fine-tuning); needs peft")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha")
    policy_server: str | None = Field(
        None,
        description="roll out through this vLLM server (http://host:port/v1, on a filesystem the trainer shares, "
        "started with VLLM_SERVER_DEV_MODE=1); full weights are synced into it after every optimizer step "
        "(policy/served.py). None: roll out in process",
    )
    policy_server_model: str = Field("embedded", description="the policy server's served model name")

    # -- tasks and harnesses --------------------------------------------------------------------
    suite: str = Field("workspace", description="task suite name or task file")
    train_split: str = Field("train", description="split to train on")
    eval_split: str = Field("test", description="split to evaluate on")
    tiers: list[int] = Field(default_factory=lambda: [1, 2, 3, 4], description="task difficulty tiers used")
    families: list[str] | None = Field(None, description="task families used (None = all)")
    max_train_tasks: int | None = Field(None, ge=1, description="cap on the number of training tasks")
    design: DesignName = Field("orthogonal", description="training design (paper: orthogonal = OA(18, 3^5))")
    design_n: int | None = Field(None, description="size of a random design")
    base_harness: str | None = Field(None, description="H0 for single/first-order (default: first OA row)")
    pairing: Literal["neighbour", "repeat", "random"] = Field("neighbour", description="task-harness pairing strategy")
    k: int = Field(2, ge=1, description="configurations per task, on K successive steps (paper: 2)")

    # -- rollouts ---------------------------------------------------------------------------------
    algorithm: Literal["grpo", "ppo"] = Field(
        "grpo", description="grpo: group-relative advantages; ppo: value head + GAE over turns, one rollout per task"
    )
    tasks_per_step: int = Field(16, ge=1, description="tasks per step (paper GRPO: 16)")
    group_size: int = Field(8, ge=1, description="rollouts per task per step, the GRPO group (paper: 8)")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature of training rollouts")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling of training rollouts")
    max_turns: int = Field(12, ge=1, description="turns per episode")
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, description="tokens the policy may sample per turn")
    context_tokens: int = Field(8192, ge=256, description="model context window")
    max_concurrent: int = Field(EngineOptions.max_concurrent, ge=1, description="episodes in flight in the rollout engine")
    cascade_attention: bool = Field(
        False,
        description="the in-process policy (rollouts and the run's evaluations) reads a prompt prefix that rows of "
        "a batch share (a GRPO group's) once per decode step (policy/cascade.py): the same attention up to "
        "rounding, fewer keys and values read",
    )
    attention_kernels: bool | None = Field(
        None,
        description="the in-process policy's C++ decode- and prefill-attention kernels (policy/decode_kernel.py), in "
        "rollouts and in evaluations of this run's checkpoints: null uses them wherever they fit and build, false "
        "keeps SDPA (the attention of runs recorded before them; the same attention up to float rounding), true "
        "fails where they cannot run",
    )
    continuous_batching: bool = Field(
        EngineOptions.continuous_batching,
        description="in-process rollouts and evaluations run one decode batch that each episode's next request joins "
        "at the next decode step (policy/continuous.py), instead of waiting for the batch's last row; tokens as a "
        "request gets alone, up to float rounding; with deterministic the joins are a function of the jobs",
    )
    env_workers: int = Field(EngineOptions.env_workers, ge=1, description="threads for sandbox steps")
    sandbox_backend: str = Field(EngineOptions.backend, description="sandbox backend: auto, bwrap, unshare, none")

    rollout_through: str = Field(
        "harness",
        description="what runs a step's rollouts: 'harness' (our white-box harnesses, the design's configurations) "
        "or 'ext:<agent>' (black-box: runs of a real agent program, e.g. ext:openclaw, against a server over the "
        "current policy; rl/blackbox.py)",
    )
    objective: Literal["rl", "sft"] = Field(
        "rl",
        description="the update of a step: rl (GRPO/PPO on the step's rollouts) or sft (behaviour cloning on the "
        "step's successful rollouts: black-box SFT when rollouts go through an agent)",
    )
    sft_source: Literal["policy", "gold"] = Field(
        "policy",
        description="objective sft: whose runs are cloned: policy (the current policy's successful runs, rejection "
        "sampling) or gold (each task's gold solution replayed through the agent's own tools, our oracle; needs "
        "rollout_through ext:<agent>)",
    )
    agent_max_steps: int = Field(12, ge=1, description="agent programs (black-box training and ext:<agent> evaluation in experiments): their own step limit per run")
    agent_time_limit_s: float = Field(600.0, gt=0.0, description="agent programs: wall-clock seconds per run (training and experiment evaluation)")
    agent_concurrency: int = Field(
        4, ge=1, description="black-box: agent runs in flight at once (each in its own sandbox, one shared server)"
    )

    # -- the update ---------------------------------------------------------------------------------
    steps: int = Field(300, ge=0, description="optimizer steps (paper: 300)")
    learning_rate: float = Field(1e-6, gt=0.0, description="peak learning rate")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="after warm-up")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0.0, description="gradient clipping norm")
    micro_batch_tokens: int = Field(4096, ge=64, description="padded tokens per forward/backward micro-batch")
    activation_checkpointing: bool = Field(
        False,
        description="recompute each decoder layer's activations in the backward pass instead of keeping them "
        "(verl's enable_gradient_checkpointing, TRL's gradient_checkpointing): the same gradients, bit for bit, "
        "at about one hidden state per layer and token of memory, for one more forward per update; lets "
        "micro_batch_tokens grow so that a group's prompt runs once (rl/forward.py). On in the quick preset",
    )
    lm_head_chunk_tokens: int = Field(
        0, ge=0,
        description="project a micro-batch's trained positions through the LM head this many at a time, each "
        "chunk's logits recomputed in the backward pass (Liger's fused linear cross-entropy; rl/forward.py): the "
        "head's float32 logits and log-softmax (about 14 bytes per position and vocabulary entry, 0.7 MB per "
        "position for the embedded model) exist for one chunk at a time; the same log-probabilities, the head's "
        "gradient summed chunk by chunk (float rounding). 0: all at once",
    )
    causal_mask_only: bool = Field(
        False,
        description="run a micro-batch without a shared prefix under the causal mask alone, without its padding "
        "mask (rows are right-padded, so no real token attends to a pad): scaled-dot-product attention then skips "
        "the score blocks above the diagonal instead of computing all of them under a mask, 1.4-1.9x an update's "
        "forward and backward on 900-1,700-token demonstrations. The real tokens' hidden states are the same bit "
        "for bit; gradients differ in the attention backward's order of summation (6e-7 relative in float32, "
        "6e-3 under bfloat16 autocast), so runs recorded without it do not repeat bit for bit. On in the quick preset",
    )
    ppo_epochs: int = Field(
        1,
        description="passes over each step's rollouts (verl ppo_epochs, TRL num_iterations; PPO, Schulman et al. "
        "2017): the old log-probs are computed once per step, so later optimizer steps see ratios away from 1 "
        "and the clip acts; 1 pass of 1 mini-batch is the on-policy update",
    )
    mini_batches: int = Field(
        1,
        description="optimizer steps per pass: the step's samples are shuffled (seeded by seed and step) and split "
        "into this many mini-batches (verl: train batch size / ppo_mini_batch_size); the PPO value head trains "
        "in the same mini-batches; the learning-rate schedule still advances once per step",
    )
    clip_low: float = Field(0.20, ge=0.0, description="lower clip range eta- (Harness-S: 0.20)")
    clip_high: float = Field(0.28, ge=0.0, description="upper clip range eta+ (Harness-S: 0.28; classic PPO 0.2)")
    aggregation: Literal["token_mean", "seq_mean", "token_sum_norm"] = Field("token_mean", description="loss aggregation")
    loss_norm_tokens: int | None = Field(
        None, ge=1,
        description="aggregation token_sum_norm (Dr. GRPO, Liu et al. 2025): a mini-batch's summed token loss is "
        "divided by its sequences x this constant, whatever their lengths and packing; unset: max_turns x "
        "max_new_tokens, an episode's generation budget",
    )
    policy_loss: str = Field(
        "clipped",
        description="policy loss, an entry of rl.losses.POLICY_LOSSES: clipped = the token-level clipped surrogate "
        "(PPO, GRPO; DAPO's decoupled ranges); gspo = one ratio per sequence, clipped (GSPO, Zheng et al. 2025; "
        "unless set, clip_low 3e-4, clip_high 4e-4 and aggregation seq_mean, the loss's own)",
    )
    advantage: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="advantage estimator of algorithm grpo: grpo = (r - group mean) / group std (Shao et al. 2024; "
        "Harness-S eq. 6); rloo = r - mean of the group's other rollouts (Ahmadian et al. 2024, TRL's "
        "RLOOTrainer), never scaled by the std; PPO takes GAE over turns",
    )
    scale_std: bool = Field(True, description="divide GRPO advantages by the group std (advantage grpo only)")
    importance_cap: float = Field(2.0, gt=0.0, description="cap of the truncated rollout/train importance weight")
    kl_coef: float = Field(0.0, ge=0.0, description="KL penalty to a frozen reference (off in both papers)")
    kl_estimator: Literal["k1", "k3"] = Field("k3", description="KL estimator")
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="PPO discount over turns")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="PPO GAE lambda over turns")
    vf_coef: float = Field(0.1, ge=0.0, description="PPO value-loss coefficient")
    vf_clip: float = Field(0.2, ge=0.0, description="PPO value clip range")
    skip_no_signal_groups: bool = Field(True, description="leave groups with all-equal rewards out of the update")
    dynamic_sampling_rounds: int = Field(
        0, ge=0,
        description="dynamic sampling (DAPO, Yu et al. 2025; verl algorithm.filter_groups): after the first pass, "
        "at most this many generation rounds that replace each group with all-equal rewards by a new task under "
        "the same configuration, until tasks_per_step groups have mixed rewards; dead groups left then go to "
        "rescue (resample first, rescue what stays dead); 0 = off (rl/sampling.py)",
    )

    # -- the task frontier ----------------------------------------------------------------------------
    frontier: bool = Field(
        False,
        description="draw each K-step round's tasks from the task frontier (tasks whose estimated pass rate under "
        "the current policy is in [frontier_low, frontier_high], weighted by p(1-p)) instead of the schedule's "
        "epoch order; the K neighbouring configurations per task are unchanged (rl/frontier.py)",
    )
    frontier_decay: float = Field(0.7, gt=0.0, le=1.0, description="frontier: weight of a task's older outcomes at each new group")
    frontier_prior: float = Field(1.0, gt=0.0, description="frontier: Beta(prior, prior) prior (an unseen task is at 1/2)")
    frontier_low: float = Field(0.1, ge=0.0, le=1.0, description="frontier: lowest estimated pass rate on the frontier")
    frontier_high: float = Field(0.9, ge=0.0, le=1.0, description="frontier: highest estimated pass rate on the frontier")
    frontier_explore: float = Field(0.25, ge=0.0, le=1.0, description="frontier: share of a round's tasks drawn among tasks never seen")

    # -- Harness-S rescue -------------------------------------------------------------------------------
    rescue: Literal["none", "siblings", "h0", "mixture"] = Field(
        "none",
        description="what replaces a GRPO group in which every rollout failed: none (plain GRPO); siblings "
        "(Harness-S: the router picks rescue_k siblings, one rollout each); h0 (rescue_k more rollouts under the "
        "group's own harness); mixture (no rescue; every group mixes its harness and siblings, "
        "mixture_fraction under siblings)",
    )
    rescue_k: int = Field(8, ge=1, description="rollouts of a rescue group, one per chosen sibling (paper: K = G = 8)")
    siblings: str = Field(
        "space",
        description="where a group's siblings come from: 'space' (its Hamming-1 neighbours in the harness space), "
        "'space:R' (distance <= R), 'design' (the run's other training configurations, e.g. the other OA(18) rows), "
        "'pool:DIR' (the members of a sibling pool whose H0 is the group's harness; `harnessrl pool`), or several "
        "joined by '+', e.g. 'space+pool:pools/h0'",
    )
    router: Literal["validation", "profile", "random"] = Field(
        "validation",
        description="how siblings are picked: validation (paired validation margin over the group's harness; "
        "Harness-S' public recipes), profile (LLM voters rank siblings from behaviour profiles written at each "
        "anchor; the paper's full method; needs profile_voters) or random (the routing ablation)",
    )
    profile_voters: list[str] = Field(
        default_factory=list,
        description="profile routing: the voters, each MODEL@URL of an OpenAI-compatible endpoint (repeat one "
        "endpoint to get voters that differ by seed)",
    )
    profile_writer: str | None = Field(
        None, description="profile routing: MODEL@URL that writes the behaviour profiles (default: the first voter)"
    )
    router_per_family: bool = Field(False, description="validation routing per task family where it has evidence")
    rescue_validation_tasks: int = Field(
        8, ge=1, description="paired validation tasks (train split, drawn apart from training) per anchor"
    )
    reanchor_every: int = Field(
        10, ge=0, description="re-run the paired validation every N updates, and once after training (paper: 10; 0 = "
        "only before training)",
    )
    mixture_fraction: float = Field(
        0.5, ge=0.0, le=1.0, description="share of a group's rollouts under siblings for rescue: mixture"
    )

    # -- warm start -----------------------------------------------------------------------------------
    sft_warm_start_steps: int = Field(0, ge=0, description="SFT steps on oracle demonstrations before RL")
    sft_tasks: int = Field(32, ge=1, description="oracle demonstrations for the warm start")
    sft_learning_rate: float = Field(5e-5, gt=0.0, description="learning rate of the warm start")
    sft_lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="warm-start learning-rate schedule over its steps"
    )
    sft_harness_run: int = Field(
        1, ge=1,
        description="consecutive warm-start demonstrations from one harness (they share a system prompt, "
        "computed once per micro-batch); 1 = fully shuffled",
    )

    # -- evaluation and bookkeeping ------------------------------------------------------------------
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0 = only before and after)")
    eval_tasks: int = Field(16, ge=1, description="test tasks per evaluated harness")
    eval_held_out: int = Field(18, ge=0, description="held-out in-space configurations evaluated")
    eval_design: DesignName | None = Field(
        None, description="the design whose complement the held-out configurations are drawn from (None = the "
        "training design; its design_n, seed and base_harness as H0 apply); an experiment sets its eval.design "
        "here for arms trained on another design, so that every arm's learning "
        "curve is on the same configurations")
    eval_base_harness: str | None = Field(
        None, description="H0 of eval_design when that is single or first-order (None = base_harness); an "
        "experiment sets its eval.base_harness here for arms trained around another H0 or on another design")
    eval_out_of_space: bool = Field(True, description="also evaluate the out-of-space harnesses")
    eval_temperature: float = Field(0.0, ge=0.0, description="sampling temperature of evaluation (0 = greedy)")
    eval_base: bool = Field(True, description="evaluate the untrained model first, for the summary")
    save_every: int = Field(1, ge=1, description="checkpoint every N steps")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")
    seed: int = Field(0, description="seed of every random choice")
    deterministic: bool = Field(
        False,
        description="the same numbers twice, whatever else the machine runs: the rollout engine batches in lockstep "
        "(every admitted episode reaches its next policy call, then one batch in job order) and observations show "
        "a fixed stand-in for wall times (O2, the Codex header); every seed already comes from `seed`. On in the quick "
        "preset. Costs the overlap of sandbox steps with generation. Covers in-process rollouts: a policy_server "
        "batches by its own timing, and rollout_through: ext:<agent> programs keep their own clocks",
    )
    run_dir: str = Field("runs/latest", description="where metrics, checkpoints and the summary go")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description="trackers that mirror metrics.jsonl (the source of truth) per step, eval tables as text: "
        "tensorboard (RUN_DIR/tensorboard; pip install tensorboard) and wandb (offline, RUN_DIR/wandb, when installed)",
    )

    @field_validator("sandbox_backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        choices = ("auto", *BACKENDS)
        if value not in choices:
            raise ValueError(
                f"unknown sandbox backend {value!r}; choose one of {', '.join(choices)} (the fix for most "
                "runs: sandbox_backend: auto, which uses bwrap when usable, else unshare)"
            )
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|(cuda|xpu)(:\d+)?", value):
            raise ValueError(f"unknown device {value!r}; choose one of auto, cpu, cuda, cuda:N, mps, xpu")
        return value

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {value!r}; choose one of {', '.join(DTYPES)}")
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not self.tiers or any(t not in (1, 2, 3, 4) for t in self.tiers):
            raise ValueError(f"tiers must be a non-empty subset of 1..4, got {self.tiers}")
        if self.context_tokens <= self.max_new_tokens:
            raise ValueError("context_tokens must exceed max_new_tokens")
        if self.policy_server is not None:
            if not self.policy_server.startswith(("http://", "https://")):
                raise ValueError(f"policy_server must be an http(s) URL ending in /v1, got {self.policy_server!r}")
            if self.lora_rank:
                raise ValueError("policy_server syncs full weights (vLLM's CPU backend loads no LoRA adapters): "
                                 "set lora_rank: 0, or drop policy_server to train LoRA in process")
        if self.rescue != "none" and self.algorithm != "grpo":
            raise ValueError(f"rescue {self.rescue!r} replaces GRPO groups: it needs algorithm 'grpo', not "
                             f"{self.algorithm!r}; set rescue: none for PPO")
        if self.rescue == "siblings" and self.router == "profile" and not self.profile_voters:
            raise ValueError("router 'profile' needs profile_voters: MODEL@URL of one or more OpenAI-compatible "
                             "endpoints (e.g. a `harnessrl serve` of a local model); or use router: validation")
        SiblingSource.parse(self.siblings)  # a ValueError naming the part that is not a source
        return self

    @model_validator(mode="before")
    @classmethod
    def _policy_loss_defaults(cls, data: Any) -> Any:
        """A policy loss other than the default brings its clip ranges and aggregation, for the
        fields the config leaves unset (the registry is read only then: it imports torch)."""
        if not isinstance(data, dict) or data.get("policy_loss", "clipped") == "clipped":
            return data
        from harnessrl.rl.losses import POLICY_LOSSES

        entry = POLICY_LOSSES.get(data["policy_loss"])
        if entry is None:
            raise ValueError(f"policy_loss: unknown policy loss {data['policy_loss']!r}; choose one of "
                             f"{', '.join(POLICY_LOSSES)} (or register one: rl.losses.register_policy_loss)")
        return {"clip_low": entry.clip_low, "clip_high": entry.clip_high, "aggregation": entry.aggregation, **data}

    @model_validator(mode="after")
    def _check_update(self) -> TrainConfig:
        for name in ("ppo_epochs", "mini_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (1 = the on-policy update: one pass, one optimizer "
                                 f"step per step), got {getattr(self, name)}")
        rollouts = self.tasks_per_step * self.group_size
        if self.mini_batches > rollouts:
            raise ValueError(
                f"mini_batches {self.mini_batches} exceeds the rollouts per step (tasks_per_step x group_size = "
                f"{self.tasks_per_step} x {self.group_size} = {rollouts}); each mini-batch needs a rollout: lower "
                "mini_batches or raise tasks_per_step or group_size"
            )
        if self.rollout_through != "harness":
            if not self.rollout_through.startswith(EXTERNAL_PREFIX) or not self.rollout_through[len(EXTERNAL_PREFIX):]:
                raise ValueError(f"rollout_through must be 'harness' or 'ext:<agent>' (e.g. ext:openclaw), "
                                 f"got {self.rollout_through!r}")
            if self.rescue != "none" or self.algorithm != "grpo":
                raise ValueError(f"rollout_through {self.rollout_through} trains GRPO groups of agent runs: set "
                                 "algorithm: grpo and rescue: none (siblings are harness configurations)")
            if self.sandbox_backend == "none":
                raise ValueError("rollout_through ext:<agent> runs the agent in a real sandbox: set sandbox_backend "
                                 "to auto, bwrap or unshare")
        if self.objective == "sft" and self.sft_source == "gold" and self.rollout_through == "harness":
            raise ValueError("sft_source gold replays gold through an agent's tools: set rollout_through ext:<agent> "
                             "(in-space oracle demonstrations are the warm start, sft_warm_start_steps)")
        if (self.dynamic_sampling_rounds or self.frontier) and (self.rollout_through != "harness"
                                                               or self.algorithm != "grpo"):
            raise ValueError("dynamic_sampling_rounds and frontier choose GRPO groups of harness rollouts: set "
                             "algorithm: grpo and rollout_through: harness, or turn them off (0 / false)")
        if self.frontier_low > self.frontier_high:
            raise ValueError(f"frontier_low {self.frontier_low} exceeds frontier_high {self.frontier_high}: the "
                             "frontier is the estimated pass rates between them (defaults 0.1 and 0.9)")
        if self.advantage == "rloo" and self.algorithm != "grpo":
            raise ValueError(
                f"advantage rloo is a group baseline for algorithm grpo; algorithm {self.algorithm} takes GAE "
                "advantages: set algorithm: grpo, or leave advantage at grpo"
            )
        if self.advantage == "rloo" and self.group_size < 2:
            raise ValueError(
                "advantage rloo needs group_size of at least 2 (its baseline is the mean of the group's other "
                f"rollouts), got {self.group_size}: raise group_size or use advantage: grpo"
            )
        return self

    def rollout_settings(self, limits: HarnessLimits, *, evaluation: bool = False, temperature: float | None = None,
                         seed: int | None = None, progress: bool = True) -> RolloutSettings:
        """This run's rollouts under ``limits``: the training sampling (``temperature``, ``top_p``,
        ``max_new_tokens``) or, with ``evaluation``, the evaluation's (``eval_temperature``, no
        nucleus); ``temperature`` and ``seed`` (the first job seed) override; the sandbox,
        concurrency and lockstep are the run's."""
        if temperature is None:
            temperature = self.eval_temperature if evaluation else self.temperature
        return RolloutSettings(
            limits=limits, temperature=temperature, seed=self.seed if seed is None else seed,
            backend=self.sandbox_backend, max_concurrent=self.max_concurrent, env_workers=self.env_workers,
            progress=progress, max_new_tokens=self.max_new_tokens, top_p=1.0 if evaluation else self.top_p,
            deterministic=self.deterministic, continuous_batching=self.continuous_batching,
        )


PRESETS: dict[str, dict[str, Any]] = {
    # Minutes on a 2-core CPU: easy tiers, short turns, a small SFT warm start that teaches the
    # 135M model the tool syntax of the training harnesses, then a few GRPO steps.
    "quick": {
        "tiers": [1],
        "families": ["files", "text", "search"],
        "max_train_tasks": 64,
        "tasks_per_step": 2,
        "group_size": 4,
        "k": 2,
        "steps": 2,
        "max_turns": 3,
        "max_new_tokens": 128,
        "context_tokens": 4096,
        "temperature": 0.7,
        "learning_rate": 2e-6,
        "micro_batch_tokens": 6144,
        # the same numbers bit for bit, about half the peak memory (docs/benchmarks.md, issue 29)
        "activation_checkpointing": True,
        # the warm start's padded demonstrations without their padding mask (docs/benchmarks.md, issue 29)
        "causal_mask_only": True,
        "sft_warm_start_steps": 16,
        "sft_tasks": 64,
        "sft_learning_rate": 1e-4,
        "eval_tasks": 6,
        "eval_held_out": 4,
        "eval_out_of_space": True,
        "save_every": 10,
        "keep_checkpoints": 1,
        "deterministic": True,
    },
    # The paper's PPO setting: 128 tasks x 1 rollout per step.
    "paper-ppo": {
        "algorithm": "ppo",
        "tasks_per_step": 128,
        "group_size": 1,
        "k": 2,
        "steps": 300,
        "learning_rate": 1e-6,
        "eval_every": 25,
        "eval_tasks": 64,
        "eval_held_out": 18,
        "skip_no_signal_groups": False,
    },
    # The paper's protocol (GRPO): 16 tasks x 8 rollouts, K=2 over OA(18), 300 steps.
    "paper": {
        "tasks_per_step": 16,
        "group_size": 8,
        "k": 2,
        "steps": 300,
        "learning_rate": 1e-6,
        "eval_every": 25,
        "eval_tasks": 64,
        "eval_held_out": 18,
    },
}


def config_error_message(source: str, exc: ValidationError, origins: Mapping[str, str] | None = None) -> str:
    """Returns a message naming the file, each bad field and the fix; ``origins`` maps a field
    to where its value came from (e.g. ``--set lr=x``), added to that field's line."""
    lines = [f"{source}: invalid training config"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; valid fields are: {', '.join(TrainConfig.model_fields)}"
        origin = (origins or {}).get(str(err["loc"][0])) if err["loc"] else None
        lines.append(f"  field {field}: {msg}" + (f" (given as {origin})" if origin else ""))
    return "\n".join(lines)


def _annotation_types(name: str) -> set[Any]:
    """The plain types a field accepts: ``str | None`` gives {str, NoneType}; a Literal of
    strings counts as str."""
    annotation = TrainConfig.model_fields[name].annotation
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    out: set[Any] = set()
    for member in members:
        if get_origin(member) is Literal:
            out.update(type(v) for v in get_args(member))
        else:
            out.add(get_origin(member) or member)
    return out


def _coerce_set_value(name: str, value: Any, text: str) -> Any:
    """Fixes what YAML guesses wrong for a field's type: YAML 1.1 reads ``1e-5`` as a string
    (it wants ``1.0e-5``), and ``on``/``123`` as a bool/int where a field wants a string."""
    accepts = _annotation_types(name)
    if isinstance(value, str) and accepts & {int, float} and str not in accepts:
        try:
            number = float(value)
        except ValueError:
            return value  # pydantic reports it, naming the field
        if float in accepts:
            return number
        return int(number) if number.is_integer() else value
    if isinstance(value, bool | int | float) and str in accepts and not accepts & {bool, int, float}:
        return text  # e.g. --set model=2024 names a folder "2024"
    return value


def parse_set_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parses ``FIELD=VALUE`` items (``harnessrl train --set``) into config values; VALUE is
    YAML (``[1, 2]``, ``null``, ``false``, ``1e-5``). A later item for a field wins."""
    fields = TrainConfig.model_fields
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name:
            example = f"--set {name or 'learning_rate'}={'VALUE' if name else '1e-5'}"
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE, e.g. {example}")
        if name not in fields:
            if name == "preset":
                raise ValueError(f"--set {item}: preset is not a config field; use --preset {text or 'NAME'}")
            close = difflib.get_close_matches(name, list(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"--set {item}: unknown field {name!r}{hint} "
                "(`harnessrl train --print-config` lists every field)"
            )
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
            detail = ": ".join(str(x) for x in parts if x) or str(exc).splitlines()[0]
            raise ValueError(f"--set {item}: field {name}: value is not valid YAML ({detail})") from None
        out[name] = _coerce_set_value(name, value, text)
    return out


def yaml_config_file(path: str | Path) -> Any:
    """Returns the parsed YAML of a config file (None for an empty one); a ValueError names the
    file when it is missing, not a regular file, not UTF-8 text or not valid YAML."""
    file = Path(path)
    if not file.exists():
        raise ValueError(f"config file {path}: does not exist")
    if not file.is_file():
        raise ValueError(f"config file {path}: not a file (a YAML file of config fields is expected)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config file {path}: not UTF-8 text (byte {exc.start}); is it a binary file?") from None
    except OSError as exc:
        raise ValueError(f"config file {path}: cannot be read: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None


def load_config(
    path: str | Path | None = None,
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
    sets: Sequence[str] | None = None,
) -> TrainConfig:
    """Returns the config: the preset (default ``quick``), then the file, then ``sets``
    (``FIELD=VALUE`` items, see `parse_set_overrides`; a null there sets the field to None),
    then ``overrides`` (where None means "not given")."""
    values: dict[str, Any] = {}
    preset_name = preset or ("quick" if path is None else None)
    if preset_name is not None:
        if preset_name not in PRESETS:
            raise ValueError(f"unknown preset {preset_name!r}; choose one of {', '.join(PRESETS)}")
        values.update(PRESETS[preset_name])
    source = "overrides"
    if path is not None:
        source = str(path)
        data = yaml_config_file(path)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of config fields at the top level")
        if "preset" in data:
            name = data.pop("preset")
            if name not in PRESETS:
                raise ValueError(f"{path}: field preset: unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
            values.update(PRESETS[name])
        values.update(data)
    set_values = parse_set_overrides(sets or [])
    values.update(set_values)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values.update(given)
    # A bad value that came from --set names the item it came from (unless a flag replaced it).
    origins: dict[str, str] = {}
    for item in sets or []:
        name = item.partition("=")[0].strip()
        if name in set_values and name not in given:
            origins[name] = f"--set {item.strip()}"
    try:
        return TrainConfig(**values)
    except ValidationError as exc:
        raise ValueError(config_error_message(source, exc, origins)) from None
