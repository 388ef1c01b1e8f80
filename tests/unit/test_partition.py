import pytest
import torch

from psgd.data.datamodule import ShardSampler, eval_batches
from psgd.data.partition import label_groups, partition

LABELS = torch.arange(1000) % 10


def as_sets(shards):
    return [set(s.tolist()) for s in shards]


@pytest.mark.parametrize(
    "scheme,kwargs",
    [("iid", {}), ("sizes", {"sizes": [0.5, 0.2, 0.3]}), ("by_label", {}), ("dirichlet", {"alpha": 0.5})],
)
def test_every_scheme_gives_disjoint_shards_covering_the_data(scheme, kwargs):
    shards = partition(LABELS[:999], 3, scheme, seed=4, epoch=2, **kwargs)
    sets = as_sets(shards)
    assert sum(len(s) for s in shards) == 999
    assert set().union(*sets) == set(range(999))
    assert all(len(a & b) == 0 for i, a in enumerate(sets) for b in sets[i + 1 :])


@pytest.mark.parametrize(
    "scheme,kwargs", [("iid", {}), ("sizes", {"sizes": [0.7, 0.3]}), ("by_label", {}), ("dirichlet", {"alpha": 1.0})]
)
def test_partition_is_a_pure_function_reshuffled_every_epoch(scheme, kwargs):
    a = partition(LABELS, 2, scheme, seed=1, epoch=0, **kwargs)
    b = partition(LABELS, 2, scheme, seed=1, epoch=0, **kwargs)
    c = partition(LABELS, 2, scheme, seed=1, epoch=1, **kwargs)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))  # a new order each epoch
    if scheme != "iid":  # fixed membership, new order
        assert as_sets(a) == as_sets(c)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_iid_is_torchs_distributed_sampler(workers):
    from torch.utils.data import DistributedSampler

    for epoch in (0, 3):
        shards = partition(LABELS, workers, "iid", seed=11, epoch=epoch)
        for rank in range(workers):
            reference = DistributedSampler(range(1000), num_replicas=workers, rank=rank, shuffle=True, seed=11)
            reference.set_epoch(epoch)
            assert shards[rank].tolist() == list(reference)


def test_iid_follows_distributed_sampler_striding_and_changes_membership():
    a = partition(LABELS, 4, "iid", seed=0, epoch=0)
    assert [len(s) for s in a] == [250] * 4
    assert as_sets(a) != as_sets(partition(LABELS, 4, "iid", seed=0, epoch=1))


def test_sizes_follow_the_fractions():
    shards = partition(LABELS, 2, "sizes", sizes=[0.7, 0.3])
    assert [len(s) for s in shards] == [700, 300]


def test_by_label_spreads_disjoint_label_sets_evenly():
    shards = partition(LABELS, 2, "by_label")
    assert set(LABELS[shards[0]].tolist()) == {0, 1, 2, 3, 4}
    assert set(LABELS[shards[1]].tolist()) == {5, 6, 7, 8, 9}
    assert [len(g) for g in label_groups(10, 3)] == [4, 3, 3]
    with pytest.raises(ValueError, match="11 workers for 10 classes"):
        partition(LABELS, 11, "by_label")


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def skew(alpha):  # mean over workers of the largest class share in the shard
        shards = partition(LABELS.repeat(10), 4, "dirichlet", seed=0, alpha=alpha)
        return sum(torch.bincount(LABELS.repeat(10)[s], minlength=10).max().item() / len(s) for s in shards) / 4

    assert skew(0.1) > skew(1.0) > skew(100.0)
    assert skew(100.0) < 0.2  # nearly iid: about 1/10 per class


def test_dirichlet_rejects_alpha_that_leaves_a_worker_empty():
    with pytest.raises(ValueError, match="no samples"):
        partition(torch.zeros(3, dtype=torch.long), 3, "dirichlet", alpha=0.01, num_classes=1)


def test_lockstep_sampler_gives_every_worker_the_same_number_of_steps():
    samplers = [ShardSampler(LABELS, 2, r, batch_size=64, scheme="sizes", sizes=[0.7, 0.3]) for r in range(2)]
    assert [len(s) for s in samplers] == [5, 5]  # ceil(300/64) = 5 steps for both, not 11 and 5
    free = [
        ShardSampler(LABELS, 2, r, batch_size=64, scheme="sizes", sizes=[0.7, 0.3], lockstep=False) for r in range(2)
    ]
    assert [len(s) for s in free] == [11, 5]
    batches = list(samplers[0])
    assert len(batches) == 5 and all(len(b) == 64 for b in batches)


def test_shard_sampler_yields_its_own_shard_in_epoch_order():
    sampler = ShardSampler(LABELS, 3, 1, batch_size=100, scheme="iid", seed=5)
    sampler.set_epoch(3)
    assert torch.equal(torch.cat(list(sampler)), partition(LABELS, 3, "iid", seed=5, epoch=3)[1])


def test_eval_batches_same_steps_everywhere_and_cover_the_set():
    samplers = [eval_batches(1001, 3, r, batch_size=100) for r in range(3)]
    assert len({len(s) for s in samplers}) == 1
    seen = torch.cat([torch.cat(list(s)) for s in samplers])
    assert sorted(seen.tolist()) == list(range(1001))
