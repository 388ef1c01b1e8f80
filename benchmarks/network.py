"""The network of this machine as an α-β model: gloo's all-reduce timed for P workers and payloads of n bytes, and
the ring all-reduce's cost 2(P-1) α + 2(P-1)/P · n / B fitted to it (one α, the latency of a message, and one B,
the bandwidth, for every P and n), printed side by side with what was measured.

    python benchmarks/network.py                                  # P = 2, 4; 4 KB to 64 MB; ~1 min on 2 cores
    python benchmarks/network.py --workers 2 4 8 --repeats 20

Each worker process has one thread; every timed all-reduce starts after a barrier, and rank 0's time of the
call is the figure (the median of `--repeats`, after 3 untimed). The fit is least squares on the relative error,
so that the 4 KB payloads (where α rules) weigh as much as the 64 MB ones (where B does). This is the calibration
of the network model psgd's simulated workers project time with (docs/simulation.md); its figures are in
docs/performance.md.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from psgd.strategies.network import Network, all_reduce_s

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import exit_unless_writable, positive, results_arguments, table, write_results  # noqa: E402

SIZES = [4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20, 64 * 2**20]  # bytes: 4 KB to 64 MB


def shown_size(size: int) -> str:
    """Bytes as 4 KiB, 1 MiB, ... (a whole number of the largest unit it fills)."""
    names = {0: "B", 10: "KiB", 20: "MiB", 30: "GiB"}
    unit = max(u for u in names if size >= 2**u and size % 2**u == 0)
    return f"{size // 2**unit} {names[unit]}"


def ring_terms(workers: int, size: int) -> tuple[float, float]:
    """The ring all-reduce's cost as (messages, bytes) per worker: 2(P-1) messages carrying 2(P-1)/P · n bytes."""
    return 2 * (workers - 1), 2 * (workers - 1) / workers * size


def fit(measured: dict[tuple[int, int], float]) -> tuple[float, float]:
    """(α in s, B in bytes/s) of the ring model, least squares on the relative error over every (P, n)."""
    keys = sorted(measured)
    design = np.array([ring_terms(p, n) for p, n in keys]) / np.array([[measured[k]] for k in keys])
    (alpha, inverse_bandwidth), *_ = np.linalg.lstsq(design, np.ones(len(keys)), rcond=None)
    return max(alpha, 0.0), 1 / max(inverse_bandwidth, 1e-15)


def model_s(workers: int, size: int, alpha: float, bandwidth: float) -> float:
    """The all-reduce's time on the fitted network as simulated workers project it (psgd.strategies.network)."""
    return all_reduce_s(size, workers, Network(bandwidth_gbps=bandwidth * 8 / 1e9, latency_ms=alpha * 1e3))


def timing_worker(rank: int, workers: int, port: int, sizes: list[int], repeats: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=workers)
    try:
        medians = {}
        for size in sizes:
            payload = torch.ones(size // 4)
            times = []
            for i in range(3 + repeats):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(payload)
                if i >= 3:
                    times.append(time.perf_counter() - start)
            medians[size] = statistics.median(times)
        if rank == 0:
            Path(out).write_text(json.dumps({str(k): v for k, v in medians.items()}))
    finally:
        dist.destroy_process_group()


def measure(workers: int, sizes: list[int], repeats: int) -> dict[int, float]:
    """Rank 0's median seconds of one all-reduce of each size, among `workers` gloo processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        mp.start_processes(
            timing_worker, args=(workers, port, sizes, repeats, out), nprocs=workers, start_method="spawn"
        )
        return {int(k): v for k, v in json.loads(Path(out).read_text()).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=positive, nargs="+", default=[2, 4], help="worker counts P (2 4)")
    parser.add_argument("--sizes", type=positive, nargs="+", default=SIZES, help="payloads in bytes (4 KB-64 MB)")
    parser.add_argument("--repeats", type=positive, default=10, help="timed all-reduces per size (10)")
    results_arguments(parser, "network")
    args = parser.parse_args(argv)
    if any(p < 2 for p in args.workers):
        parser.error("argument --workers: an all-reduce needs P >= 2")
    exit_unless_writable(args.results)
    measured = {(p, n): t for p in args.workers for n, t in measure(p, args.sizes, args.repeats).items()}
    alpha, bandwidth = fit(measured)
    rows = [
        [p, shown_size(n), f"{t * 1e3:.3f}", f"{model_s(p, n, alpha, bandwidth) * 1e3:.3f}",
         f"{model_s(p, n, alpha, bandwidth) / t:.2f}"]
        for (p, n), t in sorted(measured.items())
    ]  # fmt: skip
    header = ["P", "payload", "measured ms", "model ms", "model / measured"]
    said = f"alpha = {alpha * 1e6:.1f} us per message, B = {bandwidth / 1e9:.2f} GB/s (gloo, this machine)"
    md = f"# gloo all-reduce against the alpha-beta ring model\n\n{said}\n\n{table(rows, header)}\n"
    print(md)
    data = {
        "alpha_s": alpha,
        "bandwidth_bytes_per_s": bandwidth,
        "measured_s": [[p, n, t] for (p, n), t in sorted(measured.items())],
    }
    write_results(args.results, args.name, json.dumps(data, indent=1), md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
