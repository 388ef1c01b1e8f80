"""A CPU run's training memory, judged before any worker starts: one that cannot fit is refused in one line.

Counted on the meta device: the tensors the forward keeps for backward, the weights, their gradients and
the optimizer's state, a lower bound of what a step holds. Linux's MemAvailable and cgroup limits bound it.
"""

import copy
from contextlib import suppress
from pathlib import Path

import torch
from torch import nn

GiB = 1024**3
# What each worker process holds of its own (torch, Lightning, its data), below what one measures
WORKER_PROCESS_BYTES = 100 * 2**20


def saved_bytes(net: nn.Module, images: torch.Tensor) -> int:
    """Bytes of the tensors a training forward of `images` keeps for its backward (each storage once)."""
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()  # views share their base's storage, also on meta
        kept[storage._cdata] = storage.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(images)
    return sum(kept.values())


def activation_bytes_per_sample(net: nn.Module, image_shape: tuple[int, int, int]) -> int | None:
    """What one more sample adds to what the forward keeps for backward; None where the network cannot
    run on the meta device (.item(), no meta kernel)."""
    try:
        meta = copy.deepcopy(net).to("meta").train()
        two, three = (saved_bytes(meta, torch.zeros(n, *image_shape, device="meta")) for n in (2, 3))
    except Exception:
        return None
    return max(0, three - two)


def state_bytes(net: nn.Module, optimizer: str) -> int:
    """The weights, their gradients and the optimizer's state (SGD's momentum, Adam's two moments)."""
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    return weights * (2 + {"Adam": 2, "AdamW": 2}.get(optimizer, 1))


_CGROUPS = {  # cgroup v2 (a "0::<path>" line) and v1 (a line naming the memory controller)
    "v2": ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
    "v1": ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
}


def available_bytes() -> int | None:
    """The kernel's MemAvailable, or less under a memory limit of this process's cgroup or an ancestor's
    (the limit less the usage, the inactive file cache counted as free); None where nothing can be read."""
    rooms = []
    with suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        rooms += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")]
    with suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
            version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
            if version is None:
                continue
            root, limit, usage, inactive = _CGROUPS[version]
            group = Path(root) / path.strip().lstrip("/")
            for folder in [group, *group.parents]:
                with suppress(OSError, ValueError):
                    cap = (folder / limit).read_text().strip()
                    used = int((folder / usage).read_text())
                    stat = dict(row.split() for row in (folder / "memory.stat").read_text().splitlines())
                    if cap.isdigit() and int(cap) < 1 << 60:  # "max" (v2) or a huge number (v1): no limit
                        rooms.append(max(0, int(cap) - used + int(stat.get(inactive, 0))))
                if folder == Path(root):
                    break
    return min(rooms) if rooms else None


def memory_problem(
    net: nn.Module,
    image_shape: tuple[int, int, int],
    batch: int,
    workers: int,
    optimizer: str,
    batch_setting: str,
    available: int | None = None,
    shared_weights: bool = False,
    half: bool = False,
) -> str | None:
    """The one-line reason `workers` CPU workers training `batch` samples at a time cannot fit in the memory
    available; None where they may, or it cannot be judged. `shared_weights`: HogWild's one copy of the
    weights. `half`: a 16-bit precision, counted at half the fp32 size."""
    available = available_bytes() if available is None else available
    per_sample = activation_bytes_per_sample(net, image_shape)
    if available is None or per_sample is None:
        return None
    state, weights = state_bytes(net, optimizer), sum(p.numel() * p.element_size() for p in net.parameters())
    if half:
        per_sample, state, weights = per_sample // 2, state // 2, weights // 2
    shared = weights if shared_weights and workers > 1 else 0  # the shared weights once
    process = WORKER_PROCESS_BYTES if workers > 1 else 0  # one worker trains in this process
    fixed = state - shared + process  # each worker's own part
    need = workers * (per_sample * batch + fixed) + shared
    if need <= available:
        return None
    fits = ((available - shared) // workers - fixed) // per_sample if per_sample else 0
    each = f" x {workers} workers" if workers > 1 else ""
    hint = f"at most {fits} fits" if fits >= 1 else "not even one sample fits"
    return (
        f"{batch_setting} needs at least {need / GiB:.1f} GiB of memory to train ({per_sample / 2**20:.1f} MiB "
        f"of activations per sample x {batch}{each}, plus weights, gradients and optimizer state"
        f"{f', and {process / 2**20:.0f} MiB per worker process' if process else ''}), more than the "
        f"{available / GiB:.1f} GiB this machine has available: lower data.batch_size ({hint}"
        f"{'' if workers == 1 else ' with these workers'}) or the workers"
    )
