"""Reference: pytorch/examples' mnist_hogwild, with the lab CNN.

One model in shared memory (`model.share_memory()`), one torch.multiprocessing.Process per worker,
each with its own DataLoader over torchvision's MNIST (PIL Resize(32) + ToTensor + Normalize), its
own SGD optimizer and seed, writing into the shared weights without locks. Nothing from psgd is
imported: this is what psgd's HogWild is measured against (benchmarks/compare.py).

    python benchmarks/references/hogwild_mnist.py --data-root <dir with MNIST/raw> --workers 2

As in mnist_hogwild, every worker trains on the whole training set each epoch (shuffled with its own
seed); samples/s counts every worker's samples. Prints one JSON line like ddp_mnist.py.
"""

import argparse
import json
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from ddp_mnist import Net, test_accuracy
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

TRANSFORM = transforms.Compose(
    [transforms.Resize(32), transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
)


def train(rank: int, args: argparse.Namespace, model: torch.nn.Module, ready, go, counts) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed + rank)
    train_set = datasets.MNIST(args.data_root, train=True, download=False, transform=TRANSFORM)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    ready.wait()  # start together: data loading is not timed
    go.wait()
    samples = 0
    for _ in range(args.epochs):
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            samples += len(target)
    counts[rank] = samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--result-file", default="reference_hogwild.json")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    datasets.MNIST(args.data_root, download=True)
    model = Net()
    model.share_memory()  # gradients are allocated individually in each process
    ctx = mp.get_context("spawn")
    ready, go = ctx.Barrier(args.workers + 1), ctx.Barrier(args.workers + 1)
    counts = ctx.Array("q", args.workers)
    procs = [ctx.Process(target=train, args=(r, args, model, ready, go, counts)) for r in range(args.workers)]
    for p in procs:
        p.start()
    ready.wait()
    start = time.perf_counter()
    go.wait()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a worker failed: exit codes {[p.exitcode for p in procs]}")
    test_set = datasets.MNIST(args.data_root, train=False, transform=TRANSFORM)
    total = sum(counts[:])
    result = {
        "samples_per_s": total / elapsed,
        "train_time_s": elapsed,
        "samples": total,
        "test_acc": test_accuracy(model, test_set),
    }
    with open(args.result_file, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
