"""Gradient compression's hooks on a real 2-process gloo group, against DDP's own all-reduce: exactness where the
method is exact, error feedback's bookkeeping, QSGD's unbiasedness and the bytes each counts."""

import io
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from psgd.strategies.compression import QSGD_CHUNK, build_compressor, qsgd_quantise

pytestmark = pytest.mark.distributed

STEPS = 6
# name -> build_compressor's keywords (None: DDP's own all-reduce, no hook)
SCENARIOS = {
    "ddp": None,
    "none": {},
    "fp16": {},
    "bf16": {},
    "topk_all": {"topk_ratio": 1.0},
    "topk": {"topk_ratio": 0.1},
    "sign": {},
    # a rank at least each matrix's smaller side, every matrix compressed: the approximation is exact
    "powersgd_full": {"powersgd_rank": 10, "powersgd_start_step": 2, "min_compression_rate": 0},
    "qsgd": {"qsgd_levels": 4},
}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 3))


def build(name: str, options: dict, params: list) -> object:
    method = name.split("_")[0]
    if method == "powersgd":  # min_compression_rate is no config key: the compressor's own argument
        from psgd.strategies.compression import PowerSGD

        return PowerSGD(None, params, options["powersgd_rank"], options["powersgd_start_step"], 0, 0)
    return build_compressor(method, None, params, **options)


def train(rank: int, name: str) -> dict:
    """STEPS of SGD on this rank's own batches, the gradients exchanged as `name` says; what was computed and
    handed to torch.distributed, per parameter."""
    model = net()
    ddp = DistributedDataParallel(model)
    params = list(model.parameters())
    by_param = {"grad": [torch.zeros_like(p) for p in params], "sent": [torch.zeros_like(p) for p in params]}
    compressor, order = None, []

    def add(key: str, flat: torch.Tensor) -> None:  # a bucket-ordered flat vector into per-parameter sums
        offset = 0
        for i in order:
            n = params[i].numel()
            by_param[key][i] += flat[offset : offset + n].view_as(params[i])
            offset += n

    if SCENARIOS[name] is not None:
        compressor = build(name, SCENARIOS[name], params)

        def hook(state, bucket):
            order[:] = [compressor.index[id(p)] for p in bucket.parameters()]
            add("grad", bucket.buffer().detach().clone())
            return compressor.hook(state, bucket)

        ddp.register_comm_hook(None, hook)
    gathered = []
    real_gather, real_reduce = dist.all_gather, dist.all_reduce

    def all_gather(tensors, tensor, *args, **kwargs):
        gathered.append(tensor.clone())
        if len(gathered) == 2:  # top-k's values, then their indices: what this worker sent, dense
            values, indices = gathered
            add("sent", torch.zeros(sum(params[i].numel() for i in order)).index_put_((indices.long(),), values))
            gathered.clear()
        return real_gather(tensors, tensor, *args, **kwargs)

    def all_reduce(tensor, *args, **kwargs):
        if name == "sign":
            add("sent", tensor.clone())
        return real_reduce(tensor, *args, **kwargs)

    dist.all_gather, dist.all_reduce = all_gather, all_reduce
    try:
        data = torch.Generator().manual_seed(100 + rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS):
            x, y = torch.randn(8, 12, generator=data), torch.randint(0, 3, (8,), generator=data)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    finally:
        dist.all_gather, dist.all_reduce = real_gather, real_reduce
    out = {"weights": [p.detach().clone() for p in params], **by_param}
    if compressor is not None:
        out["count"] = compressor.take_count()
        out["resumes"] = resumes(compressor, name, params)
        out["error"] = [
            e if e is not None else torch.zeros_like(p)
            for e, p in zip(getattr(compressor, "error", [None] * len(params)), params)
        ]
    return out


def tensors(state) -> list[torch.Tensor]:
    """Every tensor in a state (dicts, lists, tuples), in order."""
    if torch.is_tensor(state):
        return [state]
    items = state.values() if isinstance(state, dict) else state if isinstance(state, list | tuple) else []
    return [t for item in items for t in tensors(item)]


def next_draw(compressor) -> float:
    """The next number the compressor's random stream gives (PowerSGD's, QSGD's), or 0 for none."""
    if hasattr(compressor, "state"):
        return float(compressor.state.rng.randn())
    return float(torch.rand(1, generator=compressor.generator)) if hasattr(compressor, "generator") else 0.0


def resumes(compressor, name: str, params: list) -> bool:
    """A fresh compressor given the state a checkpoint keeps (saved, loaded with weights_only=True) holds the same
    error, memories and random stream."""
    buffer = io.BytesIO()
    torch.save(compressor.state_dict(), buffer)
    buffer.seek(0)
    fresh = build(name, SCENARIOS[name], params)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    a, b = compressor.state_dict(), fresh.state_dict()
    flat, fresh_flat = tensors(a), tensors(b)
    same = len(flat) == len(fresh_flat) and all(torch.equal(x, y) for x, y in zip(flat, fresh_flat))
    return same and next_draw(compressor) == next_draw(fresh)


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        torch.save({name: train(rank, name) for name in SCENARIOS}, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    """Every scenario's result on each of 2 ranks."""
    out = tmp_path_factory.mktemp("compression")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(port, str(out)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"{r}.pt", weights_only=True) for r in range(2)]


def max_diff(a: list, b: list) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def test_none_through_psgds_hook_gives_ddps_weights_bit_for_bit(runs):
    for r in range(2):
        assert all(torch.equal(a, b) for a, b in zip(runs[r]["none"]["weights"], runs[r]["ddp"]["weights"]))


def test_topk_sending_every_entry_and_full_rank_powersgd_give_ddps_weights(runs):
    for r in range(2):
        assert max_diff(runs[r]["topk_all"]["weights"], runs[r]["ddp"]["weights"]) <= 1e-6
        assert max_diff(runs[r]["powersgd_full"]["weights"], runs[r]["ddp"]["weights"]) <= 1e-5
    # and lossy settings do move the weights away from DDP's (the comparison can fail)
    assert max_diff(runs[0]["topk"]["weights"], runs[0]["ddp"]["weights"]) > 1e-4


@pytest.mark.parametrize("name", ["topk", "sign"])
def test_error_feedback_keeps_what_was_not_sent(runs, name):
    """e_T + sum of what was sent = sum of the gradients, per worker."""
    for r in range(2):
        run = runs[r][name]
        kept = [e.view_as(s) + s for e, s in zip(run["error"], run["sent"], strict=True)]
        assert max_diff(kept, run["grad"]) <= 1e-5
        assert max(e.abs().max().item() for e in run["error"]) > 0  # something was held back


@pytest.mark.parametrize("name", ["topk", "sign", "powersgd_full", "qsgd"])
def test_a_compressors_state_survives_a_checkpoint(runs, name):
    """Error buffers, PowerSGD's memories and random stream, QSGD's random stream: what a resume needs, in what
    torch.load(weights_only=True) reads back."""
    assert runs[0][name]["resumes"] and runs[1][name]["resumes"]


def test_half_precision_counts_half_of_fp32s_bytes_and_sign_one_bit_an_entry(runs):
    entries = sum(p.numel() for p in net().parameters())
    none, fp16, bf16, sign = (runs[0][n]["count"] for n in ("none", "fp16", "bf16", "sign"))
    assert none == (STEPS * entries * 4, STEPS * entries * 4, STEPS)
    assert fp16 == bf16 == (none[0] // 2, none[1] // 2, STEPS)
    assert sign == (STEPS * (math.ceil(entries / 8) + 4), STEPS * entries * 4, STEPS)  # payload; as gloo sends it
    k = math.ceil(0.1 * entries)
    assert runs[0]["topk"]["count"] == (STEPS * k * 8, STEPS * k * 8, 2 * STEPS)  # values and int32 indices


def test_qsgd_is_unbiased_and_every_value_lies_on_its_grid():
    levels, draws = 4, 2000
    v = torch.randn(3 * QSGD_CHUNK + 17, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    samples = torch.stack([qsgd_quantise(v, levels, generator) for _ in range(draws)])
    chunks = torch.nn.functional.pad(v, (0, -v.numel() % QSGD_CHUNK)).view(-1, QSGD_CHUNK)
    norms = chunks.norm(dim=1).repeat_interleave(QSGD_CHUNK)[: v.numel()]
    grid = samples.abs() / norms * levels
    assert torch.allclose(grid, grid.round(), atol=1e-4) and grid.max() <= levels + 1e-4
    # QSGD's bound: E|q - v|^2 <= min(n / s^2, sqrt(n) / s) |v|^2 per chunk; the mean of N draws has 1/N of it
    bound = sum(min(QSGD_CHUNK / levels**2, math.sqrt(QSGD_CHUNK) / levels) * c.norm() ** 2 for c in chunks)
    assert ((samples.mean(0) - v) ** 2).sum() <= 5 * bound / draws
    assert ((samples[0] - v) ** 2).sum() > bound / 100  # one draw is not the input: it was quantised
