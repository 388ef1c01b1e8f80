import gzip
import os
import shutil

import pytest
import torch
from conftest import SHARED_DATA, compose_cfg, make_cifar_like, make_mnist_like

from psgd.config import check_values
from psgd.data import INFO, ClassificationData, DataError, load_split
from psgd.data.datamodule import resize
from psgd.run_checks import build_datamodule


def test_mnist_reads_gz_in_place_without_writing_beside_it(tmp_path):
    make_mnist_like(tmp_path, "MNIST", n_train=100, n_test=30)
    before = sorted(os.listdir(tmp_path / "MNIST" / "raw"))
    images, labels = load_split("mnist", str(tmp_path), train=True)
    assert images.shape == (100, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (100,) and set(labels.tolist()) == set(range(10))
    assert sorted(os.listdir(tmp_path / "MNIST" / "raw")) == before  # nothing extracted or written
    assert load_split("mnist", str(tmp_path), train=False)[0].shape == (30, 1, 28, 28)


def test_missing_dataset_without_download_names_path_and_fix(tmp_path):
    with pytest.raises(DataError) as e:
        load_split("fashion_mnist", str(tmp_path / "nowhere"), train=True, download=False)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "PSGD_DATA" in msg and "data.root" in msg
    # the way to let it download is psgd's setting, not torchvision's argument
    assert "drop data.download=false" in msg and "download=True" not in msg


def test_a_failed_download_leaves_no_empty_folders_behind(tmp_path, offline, capsys):
    """Offline: torchvision has made <root>/MNIST/raw by then; a mistyped data.root must not leave
    that tree behind."""
    (tmp_path / "kept").mkdir()  # what was there stays
    for root in (tmp_path / "typo" / "deeper", tmp_path):
        with pytest.raises(DataError, match="not found or unreadable") as e:
            load_split("mnist", str(root), train=True, download=True)
        # torchvision's several lines end in each mirror's reason: the one line gives the last one
        assert "; download: Error downloading train-images-idx3-ubyte.gz: <urlopen error no network>)" in str(e.value)
        assert ("(no such folder;" if root.name == "deeper" else "(missing MNIST/raw/train-images") in str(e.value)
    capsys.readouterr()  # torchvision's own lines about each mirror
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_truncated_file_is_one_line_naming_the_file(tmp_path):
    make_mnist_like(tmp_path, "MNIST", n_train=50, n_test=20)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte.gz"
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data[: len(data) // 2]))
    with pytest.raises(DataError) as e:
        load_split("mnist", str(tmp_path), train=True)
    assert str(path) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)


def test_corrupted_gzip_is_one_line_naming_the_file(tmp_path):
    make_mnist_like(tmp_path, "MNIST", n_train=50, n_test=20)
    path = tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    path.write_bytes(b"this is not gzip at all")
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz"):
        load_split("mnist", str(tmp_path), train=True)


def test_cifar10_loads_files_in_cifars_own_format(tmp_path):
    make_cifar_like(tmp_path, per_batch=20, n_test=30)
    images, labels = load_split("cifar10", str(tmp_path), train=True, download=False, verify_md5=False)
    assert images.shape == (100, 3, 32, 32) and labels.shape == (100,)
    test_images, _ = load_split("cifar10", str(tmp_path), train=False, download=False, verify_md5=False)
    assert test_images.shape == (30, 3, 32, 32)
    # layout survives the N x 3072 -> N x C x H x W conversion: each image's class bar (rows 2+2k..3+2k,
    # columns 2..29) is white in every channel, and the rows just outside it are not
    for image, k in zip(images, labels.tolist()):
        row = 2 + 2 * k
        assert (image[:, row : row + 2, 2:30] == 255).all()
        assert not (image[:, row + 2, 2:30] == 255).all()


def test_cifar10_from_its_tarball_alone_is_extracted_without_network(tmp_path, monkeypatch):
    """The archive as a course hands it out (cifar-10-python.tar.gz in data.root), no network: torchvision
    finds it by its md5 sum, extracts and loads it. (This archive stands in for the real one, whose md5
    torchvision knows.)"""
    import hashlib
    import tarfile

    from psgd.data import datasets

    made = make_cifar_like(tmp_path / "made", per_batch=20, n_test=30)
    root = tmp_path / "root"
    root.mkdir()
    archive = root / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(made / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(datasets.CIFAR10, "tgz_md5", hashlib.md5(archive.read_bytes()).hexdigest())
    monkeypatch.setattr("urllib.request.urlopen", None)  # any download attempt fails
    images, labels = load_split("cifar10", str(root), train=True, download=True, verify_md5=False)
    assert images.shape == (100, 3, 32, 32) and labels.shape == (100,)


def test_cifar10_md5_check_rejects_files_that_are_not_the_real_ones_and_says_how_to_accept_them(tmp_path):
    make_cifar_like(tmp_path, per_batch=5, n_test=5)
    with pytest.raises(DataError) as e:
        load_split("cifar10", str(tmp_path), train=True, download=False, verify_md5=True)
    # torchvision only says "Dataset not found or corrupted.": the line names the file and the setting
    msg = str(e.value)
    assert "md5 sum not CIFAR10's for cifar-10-batches-py/data_batch_1 and 6 more file(s)" in msg, msg
    assert "data.verify_md5=false" in msg and "\n" not in msg
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DataError, match=r"\(missing cifar-10-batches-py/test_batch\)"):
        load_split("cifar10", str(tmp_path), train=True, download=False, verify_md5=False)


def test_a_missing_mnist_file_is_named(tmp_path, request):
    make_mnist_like(tmp_path, "MNIST", n_train=20, n_test=5)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"\(missing MNIST/raw/t10k-labels-idx1-ubyte.gz\)"):
        load_split("mnist", str(tmp_path), train=True, download=False)
    with pytest.raises(DataError, match=r"\(missing FashionMNIST/raw/train-images-idx3-ubyte.gz and 3 more file"):
        load_split("fashion_mnist", str(tmp_path), train=True, download=False)
    with pytest.raises(DataError, match=r"under \S+typo \(no such folder\)"):
        load_split("mnist", str(tmp_path / "typo"), train=True, download=False)
    with pytest.raises(DataError, match=r"under \S+gz \(a file, not a folder\)"):  # a file given as data.root
        load_split("mnist", str(tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz"), train=True, download=False)
    # offline: the file, then the download's reason
    request.getfixturevalue("offline")
    with pytest.raises(DataError) as e:
        load_split("mnist", str(tmp_path), train=True, download=True)
    assert "(missing MNIST/raw/t10k-labels-idx1-ubyte.gz; download: Error downloading" in str(e.value)


def test_resize_to_32_keeps_uint8_and_content():
    x = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    x[:, :, 10:18, 10:18] = 255
    y = resize(x, 32)
    assert y.shape == (2, 1, 32, 32) and y.dtype == torch.uint8
    assert y[:, :, 14:18, 14:18].min() == 255 and y[:, :, :4, :4].max() == 0


def test_datamodule_normalises_and_holds_out_validation(tmp_path):
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    dm = ClassificationData("mnist", str(tmp_path), batch_size=32, image_size=32, val_split=0.25)
    dm.setup("fit")
    assert len(dm.train_set[1]) == 150 and len(dm.val_set[1]) == 50
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 1, 32, 32) and x.dtype == torch.float32
    raw = dm.train_set[0][:32].float() / 255
    assert x.mean().item() == pytest.approx(((raw - 0.1307) / 0.3081).mean().item(), abs=1.0)
    loader = dm.val_dataloader()
    assert sum(len(b[1]) for b in loader) == 50


def test_the_held_out_samples_are_the_seeds_whatever_the_workers_and_a_count_leaving_none_is_refused(tmp_path):
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    root = [f"data.root={tmp_path}", "data.val_split=60"]
    one, four = (
        build_datamodule(check_values(compose_cfg(*root, *more)))
        for more in ([], ["workers=4", "strategy=model_averaging", "trainer.devices=4"])
    )
    for dm in (one, four):
        dm.setup("fit")
    assert (len(one.val_set[1]), len(one.train_set[1])) == (60, 140)  # a number of samples, not a fraction
    assert torch.equal(one.val_set[0], four.val_set[0]) and torch.equal(one.train_set[0], four.train_set[0])
    other = build_datamodule(check_values(compose_cfg(*root, "seed=1")))
    other.setup("fit")
    assert not torch.equal(one.val_set[0], other.val_set[0])  # drawn with the seed
    with pytest.raises(DataError) as e:
        ClassificationData("mnist", str(tmp_path), val_split=200).setup("fit")
    assert str(e.value) == (
        "data.val_split=200 holds out 200 of the 200 training samples of data=mnist and leaves none to train on: "
        "use fewer, a fraction below 1, or 0 to validate on the test split"
    )


def test_a_run_where_a_worker_gets_no_training_batch_is_refused_before_it_starts(tmp_path):
    # a worker without a batch would train zero steps under DDP, or fail inside the worker
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)

    def data(**kw):
        dm = ClassificationData("mnist", str(tmp_path), **kw)
        dm.prepare_data()
        return dm

    # 150 training samples after the hold-out, 75 per worker: a batch of 75 fits, 76 with drop_last does not
    data(batch_size=75, val_split=0.25, drop_last=True).check_batches(2)
    with pytest.raises(DataError) as e:
        data(batch_size=76, val_split=0.25, drop_last=True).check_batches(2)
    assert str(e.value).startswith("no training batch for worker 0 (75 samples), worker 1 (75 samples) of 2")
    assert str(e.value).endswith(
        "data.batch_size=76 and data.drop_last=true: use a smaller data.batch_size, data.drop_last=false or at most "
        "1 worker"
    )
    data(batch_size=76, val_split=0.25).check_batches(2)  # the partial batch is kept
    # a huge worker count: one readable line (it listed every empty worker, a megabyte for workers=100000)
    with pytest.raises(DataError) as e:
        data(batch_size=16, drop_last=True).check_batches(100_000)
    assert str(e.value).startswith(
        "no training batch for worker 0 (1 samples), worker 1 (1 samples), worker 2 (1 samples) and 99997 more of "
        "100000 with 200 training samples"
    )
    assert str(e.value).endswith("use a smaller data.batch_size, data.drop_last=false or at most 12 workers")
    assert len(str(e.value)) < 300
    # a share too small for one sample
    with pytest.raises(DataError, match=r"for worker 1 \(0 samples\) of 2 .* give it a larger share"):
        data(partition="sizes", partition_sizes=[0.999, 0.001]).check_batches(2)
    with pytest.raises(DataError, match="^data.partition=dirichlet: dirichlet_alpha=0.0001 left worker"):
        data(partition="dirichlet", dirichlet_alpha=1e-4).check_batches(10)


def test_a_test_fraction_that_leaves_no_test_batch_is_refused_before_training(tmp_path):
    # Lightning refused it only in the test after training: the run had trained and then failed
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    dm = ClassificationData("mnist", str(tmp_path), eval_batch_size=16)  # 4 test batches
    dm.prepare_data()
    for fine in (0.25, 0.5, 1.0, 1, 3, None):
        dm.check_test_limit(fine)
    with pytest.raises(DataError) as e:
        dm.check_test_limit(0.2)
    assert str(e.value) == (
        "trainer.limit_test_batches=0.2 is invalid: the test set is 4 batch(es) of data.eval_batch_size=16, "
        "and 0.2 of them is none; use at least 0.25, a number of batches, or null for all"
    )


def test_the_check_counts_the_shards_the_workers_will_train_on(tmp_path):
    # the check reads only the labels, before setup: its shards must be the ones setup gives the workers
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    kw = {"batch_size": 32, "val_split": 0.2, "partition": "sizes", "partition_sizes": [0.8, 0.05, 0.15]}
    real = ClassificationData("mnist", str(tmp_path), drop_last=True, **kw)
    real.setup("fit")
    sizes = [len(s) for s in real.train_sampler(3, 0).shards()]
    assert sizes == [128, 8, 24] and real.train_sampler(3, 0).counts() == [4, 0, 0]
    checked = ClassificationData("mnist", str(tmp_path), drop_last=True, **kw)
    checked.prepare_data()
    with pytest.raises(DataError, match=r"worker 1 \(8 samples\), worker 2 \(24 samples\) of 3 with 160 training"):
        checked.check_batches(3)
    kept = ClassificationData("mnist", str(tmp_path), **kw)  # drop_last=false: 4, 1 and 1 batches
    kept.prepare_data()
    kept.check_batches(3)


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_batches_are_the_normalised_images_and_labels_in_sampler_order(tmp_path, name):
    if name == "mnist":
        make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    else:
        make_cifar_like(tmp_path)
    dm = ClassificationData(
        name, str(tmp_path), batch_size=32, eval_batch_size=16, val_split=0.25, channels_last=True, verify_md5=False
    )
    dm.setup("fit")
    images, labels = dm.val_set
    info = INFO[name]
    mean, std = torch.tensor(info.mean).view(1, -1, 1, 1), torch.tensor(info.std).view(1, -1, 1, 1)
    start = 0
    for x, y in dm.val_dataloader():  # the evaluation order is the split's own
        want = (images[start : start + len(y)].float() / 255 - mean) / std
        assert x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x, want, rtol=0, atol=1e-5)
        assert torch.equal(y, labels[start : start + len(y)])
        start += len(y)
    assert start == len(labels)


def test_training_batches_are_each_sampler_batch_in_order(tmp_path):
    """Each batch is its own index batch of the epoch's order, normalised, the last one short."""
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    dm = ClassificationData("mnist", str(tmp_path), batch_size=32, channels_last=True)
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    want = list(loader.sampler)  # the epoch's index batches: 6 of 32 and one of 8
    assert [len(i) for i in want] == [32] * 6 + [8]
    got = list(loader)
    images, labels = dm.train_set
    info = INFO["mnist"]
    for (x, y), idx in zip(got, want, strict=True):
        torch.testing.assert_close(x, (images[idx].float() / 255 - info.mean[0]) / info.std[0], rtol=0, atol=1e-5)
        assert torch.equal(y, labels[idx]) and x.is_contiguous(memory_format=torch.channels_last)
    assert [i.tolist() for i in loader.seen] == [i.tolist() for i in want]  # what record_shards saves


@pytest.mark.real_data
@pytest.mark.skipif(not (SHARED_DATA / "MNIST").exists(), reason="../shared/data not present")
@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_real_files_decode_to_the_known_sizes(tmp_path, name, folder):
    # copy so that a read-only shared folder is provably never written to
    shutil.copytree(SHARED_DATA / folder, tmp_path / folder)
    images, labels = load_split(name, str(tmp_path), train=True)
    assert images.shape == (60000, 1, 28, 28)
    assert torch.bincount(labels).tolist() == (
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949] if name == "mnist" else [6000] * 10
    )
    assert load_split(name, str(tmp_path), train=False)[0].shape == (10000, 1, 28, 28)
    assert sorted(os.listdir(tmp_path / folder / "raw")) == sorted(os.listdir(SHARED_DATA / folder / "raw"))


class OneDevicePerOp(torch.overrides.TorchFunctionMode):
    """CUDA's rule on any device: every tensor an op takes is on one device (0-dim host tensors aside)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [*args, *kwargs.values()]
        flat += [t for a in flat if isinstance(a, list | tuple) for t in a]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        devices = {t.device for t in tensors if not (t.dim() == 0 and t.device.type == "cpu")}
        assert len(devices) <= 1, f"{getattr(func, '__name__', func)} mixes devices {devices}"
        return func(*args, **kwargs)


def _on(dm: ClassificationData, device: str) -> ClassificationData:
    """`dm` as Lightning attaches it to a trainer whose device is `device`."""
    from types import SimpleNamespace

    strategy = SimpleNamespace(root_device=torch.device(device))
    dm.trainer = SimpleNamespace(strategy=strategy, world_size=2, global_rank=1)
    return dm


@pytest.mark.parametrize("augment", ["none", "pad_crop_flip"])
def test_on_device_makes_every_batch_on_the_trainers_device_from_the_same_shard(tmp_path, augment):
    # No GPU here: the meta device stands in for one. It holds no values, so this checks where the data
    # and every batch go (values are checked on the host above; the ops are the same on any device).
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    kw = dict(batch_size=32, eval_batch_size=16, channels_last=True, augment=augment)
    host = _on(ClassificationData("mnist", str(tmp_path), **kw), "meta")  # on_device off: the device is ignored
    dev = _on(ClassificationData("mnist", str(tmp_path), on_device=True, **kw), "meta")
    for dm in (host, dev):
        dm.setup("fit")
    train_host, train_dev = host.train_dataloader(), dev.train_dataloader()
    shapes = [(x.shape, y.shape) for x, y in train_host]
    with OneDevicePerOp():
        batches = list(train_dev)
    assert [(x.shape, y.shape) for x, y in batches] == shapes and len(shapes) == 4  # rank 1 of 2: 100 samples
    assert all(x.device.type == "meta" and y.device.type == "meta" for x, y in batches)
    assert all(x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last) for x, _ in batches)
    assert all(x.device.type == "cpu" for x, _ in train_host)
    # the shard and its order come from the host labels, as without on_device; recorded indices stay on the host
    assert [i.tolist() for i in train_dev.seen] == [i.tolist() for i in train_host.seen]
    assert all(i.device.type == "cpu" for i in train_dev.seen)
    for loader in (dev.val_dataloader(), dev.test_dataloader()):
        with OneDevicePerOp():
            evaluated = list(loader)
        assert sum(len(y) for _, y in evaluated) == 25 and all(x.device.type == "meta" for x, _ in evaluated)
    # copied once per split and device, and never pickled into a worker
    assert len(dev._placed) == 2  # train, test (= val)
    dev.train_dataloader()
    assert len(dev._placed) == 2
    import pickle

    dev.trainer = None
    assert pickle.loads(pickle.dumps(dev))._placed == {}


class IndexTransfers(torch.overrides.TorchFunctionMode):
    """Counts index tensors (int64) copied from the host to another device."""

    count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.to and args[0].dtype == torch.int64 and args[0].device != out.device:
            self.count += 1
        return out


def test_on_device_copies_an_epochs_index_batches_in_one_transfer(tmp_path):
    # a small host-to-GPU copy per step costs a driver call each; the epoch's order is known at its start
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    dev = _on(ClassificationData("mnist", str(tmp_path), batch_size=32, on_device=True), "meta")
    host = _on(ClassificationData("mnist", str(tmp_path), batch_size=32), "meta")
    for dm in (dev, host):
        dm.setup("fit")
    loader, host_loader = dev.train_dataloader(), host.train_dataloader()
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        host_loader.sampler.set_epoch(epoch)
        with IndexTransfers() as moves:
            batches = list(loader)
        assert moves.count == 1 and len(batches) == 4  # rank 1 of 2: 100 samples
        assert [len(y) for _, y in batches] == [len(y) for _, y in host_loader]
        assert [i.tolist() for i in loader.seen] == [i.tolist() for i in host_loader.seen]
    val = dev.val_dataloader()  # places the split on the device (once, tested above)
    with IndexTransfers() as moves:
        evaluated = list(val)
    assert moves.count == 1 and sum(len(y) for _, y in evaluated) == 25


def test_on_device_on_the_host_gives_the_same_batches(tmp_path):
    make_mnist_like(tmp_path, "MNIST", n_train=200, n_test=50)
    a = _on(ClassificationData("mnist", str(tmp_path), batch_size=32), "cpu")
    b = _on(ClassificationData("mnist", str(tmp_path), batch_size=32, on_device=True), "cpu")
    for dm in (a, b):
        dm.setup("fit")
    for (xa, ya), (xb, yb) in zip(a.train_dataloader(), b.train_dataloader(), strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert b._placed == {}  # nothing copied: the host is where batches are made anyway


def test_each_dataset_names_its_classes_as_torchvision_does():
    """metrics.json's test_classes and the report's worst_class name each label."""
    from torchvision import datasets as tvd

    assert list(INFO["mnist"].classes) == tvd.MNIST.classes
    assert list(INFO["fashion_mnist"].classes) == tvd.FashionMNIST.classes
    assert INFO["cifar10"].classes[:3] == ("airplane", "automobile", "bird") and INFO["cifar10"].num_classes == 10
