"""Random per-sample augmentation as batched tensor ops (no per-sample PIL work).

Every function takes float images in [0, 1], shape B x C x H x W, and draws its randomness from
torch's global generator, which `seed` seeds in every worker process.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def random_flip(x: Tensor) -> Tensor:
    """Horizontal flip with probability 1/2, per sample."""
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def pad_crop_flip(x: Tensor, pad: int = 4) -> Tensor:
    """Zero-pad by `pad`, crop a random window of the original size, then random horizontal flip."""
    b, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (b,), device=x.device)
    ox = torch.randint(0, 2 * pad + 1, (b,), device=x.device)
    rows = (oy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (ox[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chans = torch.arange(c, device=x.device)[None, :, None, None]
    return random_flip(padded[batch, chans, rows, cols])


def _uniform(b: int, low: float, high: float, device) -> Tensor:
    return torch.empty(b, device=device).uniform_(low, high)


def random_affine(x: Tensor, degrees: float = 10.0, shear: float = 10.0, scale=(0.8, 1.2)) -> Tensor:
    """Rotation in +-degrees, x-shear in +-shear degrees and isotropic scale, per sample (bilinear)."""
    b = x.shape[0]
    angle = torch.deg2rad(_uniform(b, -degrees, degrees, x.device))
    sh = torch.deg2rad(_uniform(b, -shear, shear, x.device))
    s = _uniform(b, *scale, x.device)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rotation = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
    shearing = torch.zeros(b, 2, 2, device=x.device)
    shearing[:, 0, 0] = 1
    shearing[:, 0, 1] = -torch.tan(sh)
    shearing[:, 1, 1] = 1
    forward = rotation @ shearing * s[:, None, None]
    theta = torch.cat([torch.linalg.inv(forward), torch.zeros(b, 2, 1, device=x.device)], dim=2)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _gray(x: Tensor) -> Tensor:
    if x.shape[1] == 1:
        return x
    weights = torch.tensor([0.299, 0.587, 0.114], device=x.device, dtype=x.dtype)[None, :, None, None]
    return (x * weights).sum(1, keepdim=True)


def color_jitter(x: Tensor, brightness: float = 0.2, contrast: float = 0.2, saturation: float = 0.2) -> Tensor:
    """torchvision ColorJitter's brightness, contrast and saturation factors, drawn per sample."""
    b = x.shape[0]
    x = x * _uniform(b, 1 - brightness, 1 + brightness, x.device)[:, None, None, None]
    mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    x = (x - mean) * _uniform(b, 1 - contrast, 1 + contrast, x.device)[:, None, None, None] + mean
    if x.shape[1] == 3:
        gray = _gray(x)
        x = (x - gray) * _uniform(b, 1 - saturation, 1 + saturation, x.device)[:, None, None, None] + gray
    return x.clamp_(0, 1)


def cifar(x: Tensor) -> Tensor:
    """The workshop's CIFAR preset: flip, rotation +-10, shear 10, scale 0.8-1.2, colour jitter 0.2."""
    return color_jitter(random_affine(random_flip(x)))


PRESETS: dict[str, Callable[[Tensor], Tensor] | None] = {
    "none": None,
    "cifar": cifar,
    "pad_crop_flip": pad_crop_flip,
}
