"""Reference: the hand-written torch DDP script users write (the data-parallel workshop's style).

torchvision's MNIST through PIL transforms (Resize(32) + ToTensor + Normalize), a DistributedSampler,
a DataLoader, the lab CNN wrapped in DistributedDataParallel, SGD, gloo, one process per worker
started with torch.multiprocessing.spawn. Nothing from psgd is imported: this is what psgd is
measured against (benchmarks/compare.py).

    python benchmarks/references/ddp_mnist.py --data-root <dir with MNIST/raw> --workers 2 --epochs 1

Prints one JSON line: {"samples_per_s": ..., "train_time_s": ..., "samples": ..., "test_acc": ...}
(training time of the epochs only, measured on rank 0 between barriers; process start and data
loading excluded, as psgd's own figures).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    """The lab CNN, layer for layer."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.dropout = nn.Dropout(0.4)
        self.fc1 = nn.Linear(128, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.max_pool2d(self.dropout(x), 2)
        x = torch.flatten(x, 1)
        x = self.fc2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc3(x), dim=1)


def test_accuracy(model: nn.Module, test_set) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in DataLoader(test_set, batch_size=1000):
            correct += (model(data).argmax(1) == target).sum().item()
    return correct / len(test_set)


def worker(rank: int, args: argparse.Namespace, port: int, result_file: str) -> None:
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(args.seed)
    transform = transforms.Compose(
        [transforms.Resize(32), transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
    )
    train_set = datasets.MNIST(args.data_root, train=True, download=True, transform=transform)
    test_set = datasets.MNIST(args.data_root, train=False, download=True, transform=transform)
    sampler = DistributedSampler(train_set, num_replicas=args.workers, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    samples = 0
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            samples += len(target)
    dist.barrier()
    elapsed = time.perf_counter() - start
    total = torch.tensor([samples])
    dist.all_reduce(total)
    if rank == 0:
        result = {
            "samples_per_s": total.item() / elapsed,
            "train_time_s": elapsed,
            "samples": total.item(),
            "test_acc": test_accuracy(model, test_set),
        }
        with open(result_file, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-file", default="reference_ddp.json")
    args = parser.parse_args()
    datasets.MNIST(args.data_root, download=True)  # fetch once, before the workers start
    mp.spawn(worker, args=(args, free_port(), args.result_file), nprocs=args.workers)
    with open(args.result_file) as f:
        print(f.read())


if __name__ == "__main__":
    main()
