"""FSDP2 full fine-tuning (gloo, 2 CPU processes): the parameters are sharded, the update takes the
step one process takes, and the optimizer state gathers to the one-process format and back."""

import os
import random
import socket

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")
pytest.importorskip("torch.distributed.fsdp", reason="torch.distributed (gloo) is needed")

from harnessrl.rl.batching import MIN_SHARED_PREFIX, UpdateSample, micro_batches  # noqa: E402
from harnessrl.rl.distributed import DataParallel  # noqa: E402
from harnessrl.rl.forward import compute_values  # noqa: E402
from harnessrl.rl.objectives import UpdateSettings  # noqa: E402
from harnessrl.rl.update import update_step  # noqa: E402

# Measured (2026-12-01, this CPU, float32, 2 processes vs 1): the diagnostics agree to relative
# 1.7e-6, the gradient norm (float64 sums) to 5e-8, the AdamW moments to 1.4e-8 (the gradients
# are reduce-scattered in another order of sums). The weights after the two steps (lr 1e-3)
# differ by at most 2.4e-7, except the embedding rows that only loss-free prompt tokens touch
# (gradients ~1e-8, near AdamW's eps): 1.4e-6. eps is 1e-6: at the default 1e-8 those rows take
# a step of +-lr whose sign the order of the sums decides.
# approx_kl (3e-4 here) is second order in the log-ratio d: its error is about |d| times the
# log-prob error, so it takes an absolute bound; CI's CPU (2026-12-02) differed by 4.4e-9 (rel 1.4e-5).
WEIGHT_ATOL, EMBEDDING_ATOL, MOMENT_ATOL, LOSS_RTOL = 1e-6, 4e-6, 1e-7, 1e-5
SECOND_ORDER_ATOL = {"approx_kl": 2e-8}
STEPS = ({"mini_batches": 1, "seed": 0}, {"mini_batches": 2, "seed": 1})  # the second computes old log-probs


def samples():
    """A GRPO-like batch: three rollouts of one 80-token prompt (one micro-batch that runs its
    prefix once), four short ones of their own, and one without trained tokens; PPO value
    targets on every trained sample."""
    rng = random.Random(0)
    out = []
    prompt = [rng.randrange(100, 40000) for _ in range(80)]
    for i in range(3):
        completion = [rng.randrange(100, 40000) for _ in range(6 + i)]
        out.append(UpdateSample(prompt + completion, [0] * 80 + [1] * len(completion), [-10.8] * (80 + len(completion)),
                                1.0 - i, value_positions=[79], returns=[0.5 * i], old_values=[0.1]))
    for n in (20, 31, 38, 45):
        ids = [rng.randrange(100, 40000) for _ in range(n)]
        out.append(UpdateSample(ids, [0] * (n - 5) + [1] * 5, [-10.8] * n, 0.5 if n % 2 else -0.5,
                                value_positions=[n - 6], returns=[0.2], old_values=[0.0]))
    out.append(UpdateSample([5] * 10, [0] * 10, [0.0] * 10, 1.0))
    return out


def train(model_dir, data_parallel=None):
    """Two update steps (the second of two mini-batches) with a PPO value head; returns the
    metrics, the full weights, the optimizer state (the one-process format) and the model."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if data_parallel is not None:
        data_parallel.shard_model(model)
    value_head = torch.nn.Linear(model.config.hidden_size, 1)
    values = compute_values(model, value_head, samples(), 0, micro_batch_tokens=120)  # the critic's no-grad forward
    optimizer = torch.optim.AdamW([*model.parameters(), *value_head.parameters()], lr=1e-3, eps=1e-6)
    metrics = [{"values": values}] + [
        update_step(model, optimizer, samples(), 0,
                    UpdateSettings(micro_batch_tokens=120, entropy_coef=1.0, mini_batches=step["mini_batches"]),
                    value_head=value_head, seed=step["seed"], data_parallel=data_parallel) for step in STEPS]
    if data_parallel is not None:
        weights = DataParallel.full_model_state(model)
        optimizer_state = data_parallel.full_optimizer_state(optimizer)
    else:
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        optimizer_state = optimizer.state_dict()
    weights.update({f"value_head.{k}": v.detach().clone() for k, v in value_head.state_dict().items()})
    return metrics, weights, optimizer_state, (model, value_head, optimizer)


def rank_main(rank, world_size, port, model_dir, out_file):
    """One rank of the 2-process job: trains, checks its shards, writes what rank 0 gathered."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    data_parallel = DataParallel.from_env()
    ok = False
    try:
        metrics, weights, optimizer_state, (model, value_head, optimizer) = train(model_dir, data_parallel)
        shards = {}
        for name, param in model.named_parameters():
            assert isinstance(param, DTensor) and param.placements == (Shard(0),), name
            shards[name] = (tuple(param.shape), tuple(param.to_local().shape))
        assert not isinstance(value_head.weight, DTensor)  # outside the model: replicated
        # The saved format loads back into shards: each rank's moments are its rows of the full ones.
        again = torch.optim.AdamW([*model.parameters(), *value_head.parameters()], lr=1e-3, eps=1e-6)
        if rank == 0:
            torch.save(optimizer_state, out_file + ".optim")
        dist.barrier()  # every rank reads the full state rank 0 wrote, as a resume does
        full = torch.load(out_file + ".optim", weights_only=False)
        again.load_state_dict(DataParallel.shard_optimizer_state(again, full))
        restored = all(
            torch.equal(value.to_local() if isinstance(value, DTensor) else value,
                        again.state_dict()["state"][index][key].to_local()
                        if isinstance(value, DTensor) else again.state_dict()["state"][index][key])
            for index, values in optimizer.state_dict()["state"].items() for key, value in values.items()
        )
        gathered = [None] * world_size
        dist.all_gather_object(gathered, {"shards": shards, "restored": restored})
        if rank == 0:
            torch.save({"metrics": metrics, "weights": weights, "optimizer": optimizer_state, "ranks": gathered}, out_file)
        ok = True
    finally:
        data_parallel.close(ok=ok)  # both ranks meet before either tears its connections down


@pytest.fixture(scope="module")
def two_processes(tiny_model, tmp_path_factory):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out_file = str(tmp_path_factory.mktemp("fsdp") / "rank0.pt")
    torch.multiprocessing.spawn(rank_main, args=(2, port, str(tiny_model), out_file), nprocs=2, join=True)
    return torch.load(out_file, weights_only=False)


@pytest.fixture(scope="module")
def one_process(tiny_model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        metrics, weights, optimizer_state, _ = train(str(tiny_model))
    finally:
        torch.set_num_threads(threads)
    return {"metrics": metrics, "weights": weights, "optimizer": optimizer_state}


def test_every_model_parameter_is_a_row_shard_of_half_the_rows(two_processes):
    for rank, shards in enumerate(r["shards"] for r in two_processes["ranks"]):
        assert len(shards) == 20  # the tied LM head is the embedding's parameter
        for name, (full, local) in shards.items():
            assert local[1:] == full[1:], name
            assert local[0] == (full[0] + 1 - rank) // 2, (name, rank)  # torch.chunk: rank 0 takes the odd row
        assert shards["model.embed_tokens.weight"] == ((49152, 32), (24576, 32))


def test_sharded_update_takes_the_step_of_one_process(two_processes, one_process, tiny_model):
    values = [v for sample in one_process["metrics"][0]["values"] for v in sample]
    assert [v for sample in two_processes["metrics"][0]["values"] for v in sample] == pytest.approx(values, rel=1e-5)
    for two, one in zip(two_processes["metrics"][1:], one_process["metrics"][1:], strict=True):
        assert set(two) == set(one)
        assert two["optimizer_steps"] == one["optimizer_steps"] and two["micro_batches"] == one["micro_batches"]
        assert two["prefix_tokens_saved"] == one["prefix_tokens_saved"] > 0  # the shared prompt ran once
        for key, value in one.items():
            bound = SECOND_ORDER_ATOL.get(key, 1e-9)
            assert two[key] == pytest.approx(value, rel=LOSS_RTOL, abs=bound, nan_ok=True), key  # one value: no variance
    assert two_processes["metrics"][1]["grad_norm"] == pytest.approx(one_process["metrics"][1]["grad_norm"], rel=1e-7)
    differences = {name: float((two_processes["weights"][name] - value).abs().max())
                   for name, value in one_process["weights"].items()}
    tied = {"model.embed_tokens.weight", "lm_head.weight"}
    assert max(d for name, d in differences.items() if name not in tied) <= WEIGHT_ATOL, differences
    assert max(differences[name] for name in tied) <= EMBEDDING_ATOL, differences
    start = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    assert all(not torch.equal(start[name], one_process["weights"][name]) for name in start)  # every tensor moved


def test_gathered_optimizer_state_is_the_one_process_format_and_loads_back_into_shards(two_processes, one_process):
    two, one = two_processes["optimizer"], one_process["optimizer"]
    assert two["param_groups"] == one["param_groups"]
    assert set(two["state"]) == set(one["state"])
    for index, values in one["state"].items():
        for key, value in values.items():
            assert two["state"][index][key].shape == value.shape and not hasattr(two["state"][index][key], "placements")
            assert float((two["state"][index][key] - value).abs().max()) <= (MOMENT_ATOL if key != "step" else 0), (index, key)
    assert all(r["restored"] for r in two_processes["ranks"])


def shards(world_size, rank):
    parallel = DataParallel(rank, world_size)
    parallel.sharded = True
    return parallel


def test_every_rank_calls_the_sharded_model_alike():
    rng = random.Random(1)
    prompt = [rng.randrange(100, 1000) for _ in range(MIN_SHARED_PREFIX + 4)]
    group = [UpdateSample([*prompt, i, i + 1], [0] * len(prompt) + [1, 1], [0.0] * (len(prompt) + 2)) for i in range(3)]
    singles = [UpdateSample([7] * n, [0] * (n - 2) + [1, 1], [0.0] * n) for n in (30, 20, 12)]
    untrained = UpdateSample([3] * 8, [0] * 8, [0.0] * 8)
    batches = [group, [singles[0]], [singles[1]], [singles[2], untrained], [untrained]]
    per_rank = [shards(2, rank).local(batches, share_prefix=True) for rank in range(2)]
    assert [len(local) for local in per_rank] == [2, 2]  # 4 trained micro-batches, the untrained one dropped
    assert [b.weight for local in per_rank for b in local] == [1.0, 1.0, 1.0, 1.0]
    # Round 0 holds the shared-prefix group: its partner splits its forward in two calls too.
    assert [local[0].two_calls for local in per_rank] == [True, True]
    assert [local[1].two_calls for local in per_rank] == [False, False]
    assert per_rank[0][0].samples is group and per_rank[1][0].samples == [singles[0]]
    # Three ranks: the last round has one micro-batch; the others run a weight-0 stand-in of it.
    per_rank = [shards(3, rank).local(batches, share_prefix=True) for rank in range(3)]
    assert [[b.weight for b in local] for local in per_rank] == [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    assert per_rank[1][1].samples is per_rank[0][1].samples
    # Without prefix sharing no round splits; replicated ranks keep every world_size-th micro-batch.
    assert not any(b.two_calls for b in shards(2, 0).local(batches, share_prefix=False))
    assert [b.samples for b in DataParallel(1, 2).local(batches, share_prefix=True)] == batches[1::2]


def test_split_forward_computes_the_one_call_hidden_states(tiny_model):
    """The two-call forward of a micro-batch without a shared prefix is the one-call forward."""
    from harnessrl.rl.batching import collate as _collate
    from harnessrl.rl.forward import decoder_hidden

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    batch = [UpdateSample(list(range(100, 100 + n)), [0] * (n - 3) + [1] * 3, [0.0] * n) for n in (9, 14)]
    assert micro_batches(batch, 1000) == [sorted(batch, key=lambda s: -len(s.input_ids))]
    one = decoder_hidden(model.get_decoder(), _collate(batch, 0, torch.device("cpu"), share_prefix=True))
    data = _collate(batch, 0, torch.device("cpu"), share_prefix=True, two_calls=True)
    assert bool(data["split"]) and int(data["prefix_len"]) == 0
    two = decoder_hidden(model.get_decoder(), data)
    real = data["attention_mask"].bool()
    assert torch.allclose(two[real], one[real], atol=1e-5)
