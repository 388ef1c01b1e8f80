import torch

from psgd.data.augment import cifar, color_jitter, pad_crop_flip, random_affine, random_flip


def batch(b=64, c=3, size=32):
    torch.manual_seed(0)
    return torch.rand(b, c, size, size)


def test_flip_is_per_sample():
    x = batch()
    y = random_flip(x)
    flipped = [torch.equal(y[i], x[i].flip(-1)) for i in range(len(x))]
    kept = [torch.equal(y[i], x[i]) for i in range(len(x))]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 10 < sum(flipped) < 54  # about half, drawn per sample


def test_pad_crop_flip_crops_shifted_windows_of_the_padded_image():
    x = batch(b=32, c=1, size=28)
    y = pad_crop_flip(x)
    assert y.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    offsets = set()
    for i in range(len(x)):
        found = [
            (dy, dx)
            for dy in range(9)
            for dx in range(9)
            for cand in (y[i], y[i].flip(-1))
            if torch.equal(cand, padded[i, :, dy : dy + 28, dx : dx + 28])
        ]
        assert found, f"sample {i} is not a crop of its padded image"
        offsets.add(found[0])
    assert len(offsets) > 5  # random per sample, not one crop for the whole batch


def test_affine_and_jitter_keep_shape_range_and_differ_per_sample():
    x = batch()
    for fn in (random_affine, color_jitter, cifar):
        torch.manual_seed(1)
        y = fn(x.clone())
        assert y.shape == x.shape
        assert y.min() >= 0 and y.max() <= 1 + 1e-6
        same_image = x[:1].expand_as(x).clone()
        z = fn(same_image)
        assert not torch.allclose(z[0], z[1])  # different random parameters per sample


def test_affine_with_no_motion_is_identity():
    x = batch(b=4)
    y = random_affine(x, degrees=0.0, shear=0.0, scale=(1.0, 1.0))
    assert torch.allclose(x, y, atol=1e-5)
