"""Gradient compression's hooks on a real 2-process gloo group, against DDP's own all-reduce: exactness where the
method is exact, psgd's PowerSGD against torch's, every method with one bucket and with a bucket per parameter
(DDP regroups them after the first step), what error feedback sends, a resume into a fresh DDP, QSGD's
unbiasedness and the bytes each counts."""

import io
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from psgd.strategies.compression import QSGD_CHUNK, PowerSGD, build_compressor, qsgd_bits, qsgd_quantise

pytestmark = pytest.mark.distributed

STEPS, RESUME_AT = 6, 3
LAYOUTS = {"one": 25, "many": 1e-6}  # DDP's bucket_cap_mb: every parameter in one bucket; a bucket per parameter
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
    "powersgd_full": {"powersgd_rank": 40, "powersgd_start_step": 2, "min_compression_rate": 0},
    # rank 1 (Gram-Schmidt), every tensor compressed, biases too
    "powersgd": {"powersgd_rank": 1, "powersgd_start_step": 2, "min_compression_rate": 0},
    # the defaults' rule: only the 32 x 40 matrix gains (QR at rank 4); the rest is all-reduced as it is
    "powersgd_default": {"powersgd_rank": 4, "powersgd_start_step": 2, "min_compression_rate": 2},
    "qsgd": {"qsgd_levels": 4},
}
TORCH = "torch_"  # torch_<scenario>: torch's own hook with the scenario's settings (one bucket: gloo fails on more)
PARAMS = [(32, 40), (32,), (3, 32), (3,)]


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 32), nn.ReLU(), nn.Linear(32, 3))


def build(name: str, params: list) -> object:
    options = SCENARIOS[name.removeprefix(TORCH)]
    if name.startswith(TORCH):
        return powerSGD_hook.PowerSGDState(
            None,
            options["powersgd_rank"],
            options["powersgd_start_step"],
            min_compression_rate=options["min_compression_rate"],
            random_seed=0,
        )
    if name.startswith("powersgd"):  # min_compression_rate is no config key: the compressor's own argument
        rank, start, rate = options["powersgd_rank"], options["powersgd_start_step"], options["min_compression_rate"]
        return PowerSGD(None, params, rank, start, 0, rate)
    return build_compressor(name.split("_")[0], None, params, **options)


def roundtrip(state: dict) -> dict:
    """A compressor's state as a checkpoint holds it: saved, and loaded with weights_only=True."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


class Recorder:
    """Wraps a compressor's hook: per step and parameter, the gradient g this worker put in, what it handed to
    torch.distributed (`sent`, dense; top-k's values at their indices) and the bucket's result."""

    def __init__(self, compressor, params: list) -> None:
        self.compressor, self.params = compressor, params
        self.steps: list[dict] = []
        self.order: list[int] = []  # the bucket now in the hook: its parameters' indices

    def unflat(self, flat: torch.Tensor, key: str, order: list[int] | None = None) -> None:
        """A flat vector over `order`'s parameters (None: the bucket now in the hook) into the step's `key`."""
        offset = 0
        for i in self.order if order is None else order:
            n = self.params[i].numel()
            self.steps[-1][key][i] = flat[offset : offset + n].detach().clone().view_as(self.params[i])
            offset += n

    def hook(self, state, bucket):
        if not self.steps or len(self.steps[-1]["grad"]) == len(self.params):
            self.steps.append({"grad": {}, "sent": {}, "result": {}})
        self.order = [{id(p): i for i, p in enumerate(self.params)}[id(p)] for p in bucket.parameters()]
        order = list(self.order)
        self.unflat(bucket.buffer(), "grad")
        torch_state = self.compressor if isinstance(self.compressor, powerSGD_hook.PowerSGDState) else None
        if torch_state is not None:
            future = powerSGD_hook.powerSGD_hook(torch_state, bucket)
        else:
            future = self.compressor.hook(state, bucket)
        step = self.steps[-1]

        def done(fut):
            value = fut.value()
            value = value[0] if isinstance(value, list) else value
            offset = 0
            for i in order:
                n = self.params[i].numel()
                step["result"][i] = value[offset : offset + n].detach().clone().view_as(self.params[i])
                offset += n
            return value

        return future.then(done)


def intercepted(recorder: Recorder) -> tuple:
    """Stand-ins for dist.all_gather and dist.all_reduce, recording what a worker hands them as `sent` (top-k: its
    values and indices, dense; sign and QSGD: the all-reduced values)."""
    real_gather, real_reduce, gathered = dist.all_gather, dist.all_reduce, []

    def all_gather(tensors, tensor, *args, **kwargs):
        gathered.append(tensor.clone())
        if len(gathered) == 2:  # top-k's values, then their indices into every parameter, in their order
            values, indices = gathered
            size = sum(p.numel() for p in recorder.params)
            every = list(range(len(recorder.params)))
            recorder.unflat(torch.zeros(size).index_put_((indices.long(),), values), "sent", every)
            gathered.clear()
        return real_gather(tensors, tensor, *args, **kwargs)

    def all_reduce(tensor, *args, **kwargs):
        if getattr(recorder.compressor, "name", None) in ("sign", "qsgd"):
            recorder.unflat(tensor, "sent")
        return real_reduce(tensor, *args, **kwargs)

    return all_gather, all_reduce


def train(rank: int, name: str, layout: str, resume: bool = False) -> dict:
    """STEPS of SGD on this rank's own batches, the gradients exchanged as `name` says, in DDP buckets as `layout`
    says; `resume`: after RESUME_AT steps the compressor's state goes through a checkpoint into a fresh model,
    DDP (which starts from its first grouping again) and compressor, which take the remaining steps."""
    model = net()
    data = torch.Generator().manual_seed(100 + rank)
    out: dict = {}
    done = 0
    compressor = None
    while done < STEPS:
        params = list(model.parameters())
        ddp = DistributedDataParallel(model, bucket_cap_mb=LAYOUTS[layout])
        recorder = None
        if SCENARIOS.get(name, {}) is not None:
            compressor_before, compressor = compressor, build(name, params)
            if compressor_before is not None:
                compressor.load_state_dicts(roundtrip(compressor_before.state_dicts()))
            recorder = Recorder(compressor, params)
            ddp.register_comm_hook(None, recorder.hook)
        real = dist.all_gather, dist.all_reduce
        if recorder is not None:
            dist.all_gather, dist.all_reduce = intercepted(recorder)
        try:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(RESUME_AT if resume and done == 0 else STEPS - done):
                x, y = torch.randn(8, 40, generator=data), torch.randint(0, 3, (8,), generator=data)
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                done += 1
        finally:
            dist.all_gather, dist.all_reduce = real
        if recorder is not None:
            out["steps"] = out.get("steps", []) + recorder.steps
        model = net()  # fresh, with the weights reached
        model.load_state_dict(ddp.module.state_dict())
    out["weights"] = [p.detach().clone() for p in model.parameters()]
    if compressor is not None and hasattr(compressor, "take_count"):
        out["count"] = compressor.take_count()
        out["state"] = compressor.state_dicts()[0]
    return out


RUNS = [(name, layout, False) for layout in LAYOUTS for name in SCENARIOS]
RUNS += [(TORCH + name, "one", False) for name in ("powersgd", "powersgd_default")]
RUNS += [(name, "many", True) for name in ("none", "topk", "sign", "powersgd", "qsgd")]


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        torch.save({run: train(rank, *run) for run in RUNS}, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    """Every run's result on each of 2 ranks, by (scenario, layout, resumed)."""
    out = tmp_path_factory.mktemp("compression")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(port, str(out)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"{r}.pt", weights_only=False) for r in range(2)]


def max_diff(a: list, b: list) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def by_param(step: dict, key: str) -> list[torch.Tensor]:
    return [step[key][i] for i in range(len(PARAMS))]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_none_through_psgds_hook_gives_ddps_weights_bit_for_bit(runs, layout):
    for r in range(2):
        assert all(
            torch.equal(a, b)
            for a, b in zip(runs[r]["none", layout, False]["weights"], runs[r]["ddp", layout, False]["weights"])
        )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_topk_sending_every_entry_and_full_rank_powersgd_give_ddps_weights(runs, layout):
    for r in range(2):
        ddp = runs[r]["ddp", layout, False]["weights"]
        assert max_diff(runs[r]["topk_all", layout, False]["weights"], ddp) <= 1e-6
        assert max_diff(runs[r]["powersgd_full", layout, False]["weights"], ddp) <= 1e-5
    # and lossy settings do move the weights away from DDP's (the comparison can fail)
    assert max_diff(runs[0]["topk", layout, False]["weights"], runs[0]["ddp", layout, False]["weights"]) > 1e-4


@pytest.mark.parametrize("name", ["powersgd", "powersgd_default"])
def test_psgds_powersgd_gives_torchs_weights_where_torchs_hook_works(runs, name):
    """One bucket (torch's hook fails on gloo with more), from step 2: rank 1 with every tensor compressed
    (Gram-Schmidt), and rank 4 with torch's default rule, where the biases and the 3 x 32 matrix go as they are
    (QR)."""
    for r in range(2):
        ours, torchs = runs[r][name, "one", False]["weights"], runs[r][TORCH + name, "one", False]["weights"]
        assert max_diff(ours, torchs) <= 1e-6
    assert max_diff(runs[0][name, "one", False]["weights"], runs[0]["ddp", "one", False]["weights"]) > 1e-4


@pytest.mark.parametrize("name", ["topk", "sign", "qsgd"])
def test_a_method_is_the_same_whatever_the_buckets(runs, name):
    """Per parameter, what is sent does not depend on how DDP groups the parameters into buckets. (PowerSGD's first
    Qs come from one seed per bucket, as torch's: its resume test below holds it to its state instead.)"""
    for r in range(2):
        assert max_diff(runs[r][name, "one", False]["weights"], runs[r][name, "many", False]["weights"]) <= 1e-6


@pytest.mark.parametrize("name", ["none", "topk", "sign", "powersgd", "qsgd"])
def test_a_resume_into_a_fresh_ddp_goes_on_exactly(runs, name):
    """The state through a checkpoint into a fresh DDP, whose first step groups the parameters as DDP's first
    grouping does (one bucket) while the uninterrupted run's was regrouped (a bucket each): the same weights."""
    for r in range(2):
        straight, resumed = runs[r][name, "many", False], runs[r][name, "many", True]
        assert max_diff(resumed["weights"], straight["weights"]) <= 1e-6


@pytest.mark.parametrize("name", ["topk", "sign"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_error_feedback_sends_what_its_method_says_and_keeps_the_rest(runs, name, layout):
    """Per step, with p = g + e: top-k sends p at the k = ceil(0.1 d) largest |p| of the whole model and nothing
    else, sign (|p|_1 / n) sign(p) per parameter; e becomes p - sent; the bucket's result is the mean of the
    workers' sent values."""
    every = [runs[r][name, layout, False]["steps"] for r in range(2)]
    assert len(every[0]) == STEPS
    for r in range(2):
        error = [torch.zeros(shape) for shape in PARAMS]
        for step in every[r]:
            ps = [g + e for g, e in zip(by_param(step, "grad"), error, strict=True)]
            sents = by_param(step, "sent")
            if name == "topk":
                p, sent = torch.cat([x.reshape(-1) for x in ps]), torch.cat([x.reshape(-1) for x in sents])
                chosen = sent != 0
                assert int(chosen.sum()) == math.ceil(0.1 * p.numel())
                assert torch.equal(sent[chosen], p[chosen])
                assert p[chosen].abs().min() >= p[~chosen].abs().max()
            else:
                for p, sent in zip(ps, sents, strict=True):
                    assert torch.allclose(sent, p.abs().sum() / p.numel() * p.sign(), atol=1e-7, rtol=1e-6)
            error = [p - sent for p, sent in zip(ps, sents, strict=True)]
        assert max(e.abs().max().item() for e in error) > 0  # something was held back
    for a, b in zip(every[0], every[1], strict=True):
        for i in range(len(PARAMS)):
            mean = (a["sent"][i] + b["sent"][i]) / 2
            assert torch.allclose(a["result"][i], mean, atol=1e-7) and torch.equal(a["result"][i], b["result"][i])


def test_qsgd_sends_values_on_its_grid_and_their_mean_is_the_result(runs):
    """Each chunk of 512 of a parameter's entries on the grid of its norm / 4."""
    every = [runs[r]["qsgd", "many", False]["steps"] for r in range(2)]
    for a, b in zip(every[0], every[1], strict=True):
        for i in range(len(PARAMS)):
            chunks = a["grad"][i].reshape(-1).split(QSGD_CHUNK)
            norm = torch.cat([c.norm().expand(len(c)) for c in chunks]).view_as(a["grad"][i])
            grid = a["sent"][i].abs() / norm * 4
            assert (
                torch.allclose(grid, grid.round(), atol=1e-4) and (a["sent"][i].sign() * a["grad"][i].sign() >= 0).all()
            )
            assert torch.allclose(a["result"][i], (a["sent"][i] + b["sent"][i]) / 2, atol=1e-7)


def test_half_precision_counts_half_of_fp32s_bytes_sign_one_bit_an_entry_and_qsgd_its_code(runs):
    entries = sum(math.prod(s) for s in PARAMS)
    none, fp16, bf16, sign, qsgd = (runs[0][n, "one", False]["count"] for n in ("none", "fp16", "bf16", "sign", "qsgd"))
    assert none == (STEPS * entries * 4, STEPS * entries * 4, STEPS)
    assert fp16 == bf16 == (none[0] // 2, none[1] // 2, STEPS)
    # payload: 1 bit an entry and a float per parameter; as gloo carries it: fp32
    assert sign == (STEPS * sum(math.ceil(math.prod(s) / 8) + 4 for s in PARAMS), STEPS * entries * 4, STEPS)
    k = math.ceil(0.1 * entries)  # of the whole model, in two all-gathers a step: values and int32 indices
    for layout in LAYOUTS:
        assert runs[0]["topk", layout, False]["count"] == (STEPS * k * 8, STEPS * k * 8, 2 * STEPS)
    # 4 levels: xi in 0..4 with a sign, 9 symbols, 4 bits; a float for each chunk of 512 of a parameter's entries
    assert qsgd_bits(4) == 4 and qsgd_bits(16) == 6
    chunks = sum(math.ceil(math.prod(s) / QSGD_CHUNK) for s in PARAMS)
    payload = sum(math.ceil(math.prod(s) * 4 / 8) for s in PARAMS) + 4 * chunks
    assert chunks == 6 and qsgd == (STEPS * payload, STEPS * entries * 4, STEPS)
    # PowerSGD under the defaults' rule: 2 plain steps, then P (32 x 4) and Q (40 x 4) of the one matrix that
    # gains, and the 131 entries that go as they are, in 3 all-reduces (uncompressed, P, Q)
    compressed = (32 + 40) * 4 + 32 + 3 * 32 + 3
    powersgd = (2 * entries * 4 + (STEPS - 2) * compressed * 4, 2 + 3 * (STEPS - 2))
    assert runs[0]["powersgd_default", "one", False]["count"] == (powersgd[0], powersgd[0], powersgd[1])


def test_a_compressors_state_is_what_a_checkpoint_can_hold(runs):
    """Error buffers, PowerSGD's Qs and random stream, QSGD's step: read back by torch.load(weights_only=True)."""
    for name in ("topk", "sign", "powersgd", "qsgd"):
        state = runs[0][name, "many", False]["state"]
        assert roundtrip(state).keys() == state.keys()


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


def test_an_exchange_that_fails_fails_ddps_backward(tmp_path):
    """DDP must not go on with gradients its exchange did not average: the hook's future carries the exchange's
    error (a real DDP in a one-process gloo group, its compressor's exchange failing)."""
    from torch.futures import Future

    def failing(grads, last=True):
        future = Future()
        future.set_exception(RuntimeError("the exchange failed"))
        return future

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = net()
        compressor = build_compressor("sign", None, list(model.parameters()))
        compressor.exchange = failing
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, compressor.hook)
        with pytest.raises(RuntimeError, match="the exchange failed"):
            ddp(torch.randn(4, 40)).sum().backward()
    finally:
        dist.destroy_process_group()
