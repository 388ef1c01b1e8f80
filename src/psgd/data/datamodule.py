"""The LightningDataModule: tensors decoded once, batches made by indexing, shards by `partition`."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytorch_lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from psgd.choices import INFO, DatasetInfo
from psgd.data.augment import PRESETS
from psgd.data.datasets import load_split
from psgd.data.partition import HOLDOUT, generator, limited_batches, num_batches, partition, worker_seed
from psgd.errors import DataError


class ShardSampler:
    """Index batches of one worker's shard for the current epoch. `lockstep`: every worker takes the fewest
    batches any shard allows, so that uneven shards never hang DDP's all-reduce. `deal`: partition's keywords."""

    def __init__(
        self,
        labels: Tensor,
        workers: int,
        rank: int,
        batch_size: int,
        lockstep: bool = True,
        drop_last: bool = False,
        **deal: Any,
    ):
        self.labels, self.workers, self.rank, self.batch_size = labels, workers, rank, batch_size
        self.lockstep, self.drop_last, self.deal = lockstep, drop_last, deal
        self.epoch = 0
        self.same_every_epoch = False  # True: epoch 0's shards and order in every epoch (Lightning's overfit_batches)
        self._cache: tuple[int, list[Tensor]] | None = None

    def set_epoch(self, epoch: int) -> None:
        if not self.same_every_epoch:
            self.epoch = epoch

    def shards(self) -> list[Tensor]:
        """Every worker's shard this epoch (computed locally: a pure function, no communication)."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, partition(self.labels, self.workers, epoch=self.epoch, **self.deal))
        return self._cache[1]

    def counts(self) -> list[int]:
        """Batches each worker's shard holds this epoch."""
        return [num_batches(len(s), self.batch_size, self.drop_last) for s in self.shards()]

    def __len__(self) -> int:
        counts = self.counts()
        return min(counts) if self.lockstep else counts[self.rank]

    def __iter__(self) -> Iterator[Tensor]:
        mine = self.shards()[self.rank]
        for i in range(len(self)):
            yield mine[i * self.batch_size : (i + 1) * self.batch_size]


def eval_batches(n: int, workers: int, rank: int, batch_size: int) -> list[Tensor]:
    """This worker's strided share of an evaluation set of `n` samples, cut into the same number of batches
    on every worker (so nothing collective can ever wait on a worker with one batch more)."""
    largest = len(range(0, n, workers))
    return list(torch.tensor_split(torch.arange(rank, n, workers), max(1, -(-largest // batch_size))))


class TensorLoader:
    """Batches made by indexing in-memory uint8 tensors: the images as floats in [0, 1], augmented, then
    normalised per channel, with their labels. A run resumes at a whole epoch, so it keeps no place."""

    batch_sampler = None  # Lightning inspects DataLoader-like attributes; the sampler yields whole batches

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        sampler: Iterable[Tensor],
        info: DatasetInfo,
        augment: Callable[[Tensor], Tensor] | None = None,
        channels_last: bool = False,
    ):
        self.images, self.labels, self.sampler = images, labels, sampler
        self.mean = torch.tensor(info.mean, device=images.device).view(1, -1, 1, 1)
        self.std = torch.tensor(info.std, device=images.device).view(1, -1, 1, 1)
        self.augment, self.channels_last = augment, channels_last
        self.seen: list[Tensor] = []  # the index batches handed out this epoch (record_shards saves them)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        self.seen = []
        if getattr(self.sampler, "on_demand", False):  # dealt as the worker asks (HogWild's shared queue): one by one
            for idx in self.sampler:
                self.seen.append(idx)
                yield self.batch(idx.to(self.images.device))
            return
        host = list(self.sampler)  # the epoch's order is fixed when it starts
        if not host:
            return
        # the index batches go where the data is kept in one transfer (on_device: one copy, not one per step)
        placed = torch.cat(host).to(self.images.device, non_blocking=True).split([len(i) for i in host])
        for idx, on_device in zip(host, placed):
            self.seen.append(idx)
            yield self.batch(on_device)

    def batch(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The samples `idx` (on the data's device) as a batch."""
        x = self.images.index_select(0, idx).float().div_(255)
        if self.augment is not None:
            x = self.augment(x)
        x = x.sub_(self.mean).div_(self.std)
        x = x.contiguous(memory_format=torch.channels_last) if self.channels_last else x
        return x, self.labels.index_select(0, idx)


class ReplicaSamplers:
    """The samplers of every simulated worker, as one: Lightning sets their epoch; `counts` is the partition's."""

    def __init__(self, samplers: list[ShardSampler]) -> None:
        self.samplers = samplers

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(epoch)

    def counts(self) -> list[int]:
        return self.samplers[0].counts()

    def __len__(self) -> int:
        return len(self.samplers[0])


class ReplicaLoader:
    """Every simulated worker's training batch of a step, joined (simulate=true): (images, labels, sizes), the
    workers' samples in rank order, `sizes` each one's count. Worker r's batches are those its ShardSampler deals
    it, as a worker process's; with augmentation, each worker's drawn from its own random stream, `streams[r]`,
    seeded as that worker's process reseeds every epoch (WorkerSetup), and which the training step goes on with
    (dropout)."""

    batch_sampler = None

    def __init__(self, loaders: list[TensorLoader], seed: int) -> None:
        self.loaders, self.seed = loaders, seed
        self.sampler = ReplicaSamplers([loader.sampler for loader in loaders])
        self.streams: list[Tensor] = []
        self.seen_by_worker: list[list[Tensor]] = [[] for _ in loaders]

    def __len__(self) -> int:
        return len(self.sampler)

    def reseed(self, epoch: int) -> None:
        """Each worker's stream as its process's at the start of `epoch`."""
        self.streams = []
        for rank in range(len(self.loaders)):
            stream = torch.Generator().manual_seed(worker_seed(self.seed, rank, epoch))
            self.streams.append(stream.get_state())

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, list[int]]]:
        self.reseed(self.sampler.samplers[0].epoch)
        host = [list(loader.sampler) for loader in self.loaders]
        self.seen_by_worker = [[] for _ in self.loaders]
        first = self.loaders[0]
        for step in range(len(self)):
            batches = [mine[step] for mine in host]
            for seen, idx in zip(self.seen_by_worker, batches, strict=True):
                seen.append(idx)
            sizes = [len(idx) for idx in batches]
            if first.augment is None:  # one gather for every worker's samples
                x, y = first.batch(torch.cat(batches).to(first.images.device))
            else:
                parts = []
                for rank, idx in enumerate(batches):
                    torch.set_rng_state(self.streams[rank])
                    parts.append(first.batch(idx.to(first.images.device)))
                    self.streams[rank] = torch.get_rng_state()
                x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            yield x, y, sizes


def resize(images: Tensor, size: int) -> Tensor:
    """Bilinear resize of a whole uint8 image tensor, done once at load time."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = F.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return out.round_().clamp_(0, 255).to(torch.uint8)


class ClassificationData(L.LightningDataModule):
    """MNIST / FashionMNIST / CIFAR10 sharded over workers; validates on `val_split` samples held out of the
    training set (a number, or a fraction below 1), or on the test split where it is 0.

    Args:
        lockstep: every worker takes the fewest batches any shard allows (DDP: uneven shards never hang).
        shard_eval: each worker evaluates its share of a split (False: all of it, model averaging's replicas).
        on_device: each split copied once to the trainer's device, batches made there.
        replicas: simulated workers in this process (simulate=true): the training batches of every one of them
            (ReplicaLoader); 0: the trainer's processes are the workers.
    """

    def __init__(
        self,
        name: str = "mnist",
        root: str = "data",
        batch_size: int = 128,
        eval_batch_size: int = 1000,
        image_size: int | None = None,
        partition: str = "iid",
        partition_sizes: Sequence[float] | None = None,
        dirichlet_alpha: float | None = None,
        augment: str = "none",
        val_split: float = 0.0,
        seed: int = 0,
        download: bool = True,
        verify_md5: bool = True,
        lockstep: bool = True,
        drop_last: bool = False,
        channels_last: bool = False,
        shard_eval: bool = True,
        on_device: bool = False,
        replicas: int = 0,
    ):
        super().__init__()
        self.name, self.root, self.download, self.verify_md5 = name, root, download, verify_md5
        self.info = INFO[name]
        self.image_size = image_size or self.info.size
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.augment, self.val_split, self.seed = augment, val_split, seed
        self.deal = {  # partition's keywords
            "scheme": partition,
            "seed": seed,
            "sizes": partition_sizes,
            "alpha": dirichlet_alpha,
            "num_classes": self.info.num_classes,
        }
        self.lockstep, self.drop_last, self.channels_last = lockstep, drop_last, channels_last
        self.shard_eval, self.on_device, self.replicas = shard_eval, on_device, replicas
        self._decoded: dict[bool, tuple[Tensor, Tensor]] = {}  # raw splits from prepare_data, by `train`
        self.train_set: tuple[Tensor, Tensor] | None = None
        self.val_set: tuple[Tensor, Tensor] | None = None
        self.test_set: tuple[Tensor, Tensor] | None = None
        self._placed: dict[tuple[int, torch.device], tuple[Tensor, Tensor]] = {}  # on_device copies

    def prepare_data(self) -> None:
        """Download if needed and decode; the workers receive the decoded splits with the pickled datamodule."""
        for train in (True, False):
            if train not in self._decoded:
                self._decoded[train] = load_split(self.name, self.root, train, self.download, self.verify_md5)

    def decoded_from(self, other: "ClassificationData") -> None:
        """Use the splits `other` decoded (prepare_data) from the same dataset and folder."""
        self._decoded = other._decoded

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.prepare_data()  # a no-op where the decoded splits came with the datamodule
        images, labels = resize(self._decoded[True][0], self.image_size), self._decoded[True][1]
        self.test_set = (resize(self._decoded[False][0], self.image_size), self._decoded[False][1])
        self.val_set = self.test_set
        if self.val_split > 0:
            held, keep = self._holdout(len(labels))
            self.val_set = (images[held], labels[held])
            images, labels = images[keep], labels[keep]
        self.train_set = (images, labels)

    def _holdout(self, n: int) -> tuple[Tensor, Tensor]:
        """The indices `val_split` holds out of n training samples, and the rest (sorted): drawn with the
        seed alone, the same for every worker count.

        Raises:
            DataError: the hold-out would leave no training sample.
        """
        n_val = int(self.val_split) if self.val_split >= 1 else int(round(self.val_split * n))
        if n_val >= n:
            raise DataError(
                f"data.val_split={self.val_split:g} holds out {n_val} of the {n} training samples of "
                f"data={self.name} and leaves none to train on: use fewer, a fraction below 1, or 0 to "
                "validate on the test split"
            )
        perm = torch.randperm(n, generator=generator(self.seed, HOLDOUT))
        return perm[:n_val], perm[n_val:].sort().values

    def check_batches(self, workers: int) -> None:
        """Refuse a partition and batch size that leave a worker no training batch (needs prepare_data).

        Raises:
            DataError: a worker would get no training batch.
        """
        labels = self._decoded[True][1]
        if self.val_split > 0:
            labels = labels[self._holdout(len(labels))[1]]
        try:  # the shards as the workers will deal them, from the labels alone
            sampler = self.train_sampler(workers, 0, labels)
            sizes, counts = [len(s) for s in sampler.shards()], sampler.counts()
        except ValueError as e:  # a partition that leaves a worker nothing (dirichlet)
            raise DataError(f"data.partition={self.deal['scheme']}: {e}") from e
        empty = [r for r, c in enumerate(counts) if c == 0]
        if empty:
            shards = ", ".join(f"worker {r} ({sizes[r]} samples)" for r in empty[:3])
            shards += f" and {len(empty) - 3} more" if len(empty) > 3 else ""
            # iid shards are equal: the most workers that each get a batch
            n = sum(sizes) // (self.batch_size if self.drop_last else 1)
            most = f"at most {n} worker{'' if n == 1 else 's'}"
            iid = self.deal["scheme"] == "iid"
            if self.drop_last:
                fix = f"use a smaller data.batch_size, data.drop_last=false{f' or {most}' if iid else ''}"
            else:
                fix = f"each worker needs at least one sample: {f'use {most}' if iid else 'give it a larger share'}"
            raise DataError(
                f"no training batch for {shards} of {workers} with {sum(sizes)} training samples, "
                f"data.partition={self.deal['scheme']}, data.batch_size={self.batch_size} and "
                f"data.drop_last={str(self.drop_last).lower()}: {fix}"
            )

        if self.replicas and len(set(counts)) > 1:  # (lockstep: every worker takes the fewest)
            scheme = self.deal["scheme"]
            fix = (
                "a data.batch_size or worker count that gives each shard as many"
                if scheme == "iid"
                else "data.partition=iid"
            )
            raise DataError(
                f"simulate=true is invalid with data.partition={scheme}: its {workers} shards hold {min(counts)} to "
                f"{max(counts)} batches of data.batch_size={self.batch_size}, and simulated workers step together; "
                f"use {fix}, or worker processes (simulate=false)"
            )

    def check_test_limit(self, limit: float | int | None) -> None:
        """Refuse, before training, a trainer.limit_test_batches fraction that leaves the test no batch.

        Raises:
            DataError: the fraction leaves no test batch.
        """
        if not isinstance(limit, float) or not 0 < limit < 1:
            return
        batches = num_batches(len(self._decoded[False][1]), self.eval_batch_size)
        if limited_batches(batches, limit) < 1:
            raise DataError(
                f"trainer.limit_test_batches={limit} is invalid: the test set is {batches} batch(es) of "
                f"data.eval_batch_size={self.eval_batch_size}, and {limit} of them is none; use at least "
                f"{-(-100 // batches) / 100}, a number of batches, or null for all"
            )

    def __getstate__(self) -> dict:
        # workers start from the host copies and place their own (keys are object ids of this process)
        return {**self.__dict__, "_placed": {}}

    def _where(self, split: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """`split` where batches are made: with on_device on the trainer's device (copied once), else the host."""
        trainer = self.trainer
        if not self.on_device or trainer is None or trainer.strategy.root_device.type == "cpu":
            return split
        key = (id(split[0]), trainer.strategy.root_device)
        if key not in self._placed:
            self._placed[key] = (split[0].to(key[1]), split[1].to(key[1]))
        return self._placed[key]

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def train_sampler(self, workers: int, rank: int, labels: Tensor | None = None) -> ShardSampler:
        labels = self.train_set[1] if labels is None else labels
        return ShardSampler(labels, workers, rank, self.batch_size, self.lockstep, self.drop_last, **self.deal)

    def train_dataloader(self) -> TensorLoader | ReplicaLoader:
        if self.replicas:
            loaders = [self._train_loader(self.replicas, rank) for rank in range(self.replicas)]
            return ReplicaLoader(loaders, self.seed)
        return self._train_loader(*self._world())

    def _train_loader(self, workers: int, rank: int) -> TensorLoader:
        sampler = self.train_sampler(workers, rank)
        # Lightning's overfit_batches turns a DataLoader's shuffling off; this loader's sampler does it here
        sampler.same_every_epoch = (getattr(self.trainer, "overfit_batches", 0) or 0) > 0
        return TensorLoader(*self._where(self.train_set), sampler, self.info, PRESETS[self.augment], self.channels_last)

    def _eval_loader(self, split: tuple[Tensor, Tensor], sharded: bool) -> TensorLoader:
        """Each worker's share of `split` where `sharded`, else all of it for every worker."""
        batches = eval_batches(len(split[1]), *(self._world() if sharded else (1, 0)), self.eval_batch_size)
        return TensorLoader(*self._where(split), batches, self.info, channels_last=self.channels_last)

    def val_dataloader(self) -> TensorLoader:
        return self._eval_loader(self.val_set, self.shard_eval)

    def test_dataloader(self) -> TensorLoader:
        return self._eval_loader(self.test_set, self.shard_eval)

    def full_eval_loader(self, split: str) -> TensorLoader:
        """The whole val or test split, for evaluating this process's model on its own."""
        return self._eval_loader(self.val_set if split == "val" else self.test_set, sharded=False)
