"""The common corruptions of CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019) in numpy / PIL / scipy.

FedL2P (sec. 4.1.1, Table 3) builds its feature-shift federation from ten of them at
severity 3: brightness, frost, jpeg_compression, contrast, snow, motion_blur, pixelate,
speckle_noise, fog and saturate. `corrupt` applies one to a batch of uint8 RGB images,
deterministically given ``seed``. The severity parameters (`LEVELS`) are the published
ones; the recipes follow the published generator, with these substitutions (the
generator needs ImageMagick, OpenCV, scikit-image and six frost photographs):

* motion blur (``motion_blur``, ``snow``): ImageMagick's one-sided Gaussian line kernel
  (``2 ceil(radius) + 1`` taps, weight ``exp(-i^2 / 2 sigma^2)`` at ``i`` pixels along the
  angle, edge pixels repeated), written as a sum of shifted images;
* HSV (``brightness``, ``saturate``): our own vectorized RGB <-> HSV (scikit-image's formulas);
* frost: the published recipe blends ``0.9 x + 0.4 frost`` with a random crop of a frost
  photograph we do not ship. `frost_sheet` draws a procedural stand-in: a fractal haze plus
  antialiased branching ice needles, tinted blue-white. Its statistics (a bright,
  textured, low-saturation overlay) match the photographs' role, not their pixels, so
  "frost" here is a pflkit corruption of the same kind and strength, not the published one;
* fog: the published diamond-square plasma, whose noise amplitude shrinks by ``decay^2``
  per octave (what the published code effectively does).

Every corruption maps float images in [0, 1] of shape (N, H, W, 3) to the same range,
except ``jpeg_compression`` and ``pixelate``, which go through PIL on uint8 images. The
result is truncated to uint8 as the published arrays are (``np.uint8`` of a float).

The randomness (noise, blur angles, fog, snow, frost crops) comes from one generator per
(corruption, severity, seed), consumed in fixed chunks of images, so a dataset built from
the same images and seed is the same on every machine and numpy version that keeps
``default_rng``'s streams.
"""
from __future__ import annotations

import io
import math
import zlib
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

__all__ = ["CORRUPTIONS", "LEVELS", "corrupt", "corruption_rng", "rgb_to_hsv", "hsv_to_rgb", "plasma_fractal",
           "motion_blur_kernel", "motion_blur_images", "clipped_zoom", "frost_sheet"]

CORRUPTIONS = ("brightness", "frost", "jpeg_compression", "contrast", "snow", "motion_blur", "pixelate",
               "speckle_noise", "fog", "saturate")

# Published parameters of severity levels 1..5 (CIFAR-10-C generator).
LEVELS: dict[str, tuple] = {
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),  # added to HSV value
    "frost": ((1.0, 0.2), (1.0, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),  # (image, frost) weights
    "jpeg_compression": (80, 65, 58, 50, 40),  # JPEG quality
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # factor on the deviation from the channel mean
    # (loc, scale, zoom, threshold, blur radius, blur sigma, image weight)
    "snow": ((0.1, 0.2, 1.0, 0.6, 8, 3, 0.95), (0.1, 0.2, 1.0, 0.5, 10, 4, 0.9),
             (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
             (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)),
    "motion_blur": ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5)),  # (radius, sigma)
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),  # down-scaling factor
    "speckle_noise": (0.06, 0.1, 0.12, 0.16, 0.2),  # std of the multiplicative noise
    "fog": ((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)),  # (strength, plasma decay)
    "saturate": ((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2)),  # HSV s -> s * a + b
}

_CHUNK = 500  # images per step: bounds the float copies; fixed, so results never depend on it


# ---------------------------------------------------------------- helpers


def rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """RGB in [0, 1] (..., 3) -> HSV in [0, 1] (..., 3); hue 0 and saturation 0 for grays."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    v = rgb.max(-1)
    delta = v - rgb.min(-1)
    s = np.where(v > 0, delta / np.where(v > 0, v, 1.0), 0.0)
    d = np.where(delta > 0, delta, 1.0)
    h = np.where(v == r, (g - b) / d, np.where(v == g, 2.0 + (b - r) / d, 4.0 + (r - g) / d))
    h = np.where(delta > 0, (h / 6.0) % 1.0, 0.0)
    return np.stack([h, s, v], -1)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """HSV in [0, 1] (..., 3) -> RGB in [0, 1] (..., 3), the inverse of `rgb_to_hsv`."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    i = np.floor(h * 6.0)
    f = h * 6.0 - i
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    sector = (i.astype(np.int64) % 6)[..., None]
    # the (r, g, b) of each of the six hue sectors
    table = np.stack([np.stack(c, -1) for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])
    return np.take_along_axis(np.moveaxis(table, 0, -2), sector[..., None], axis=-2)[..., 0, :]


def plasma_fractal(n: int, size: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` diamond-square height maps (n, size, size) scaled to [0, 1]; ``size`` a power of two.

    Each octave sets the centres of the squares, then the midpoints of their edges, to the
    mean of their four (wrapped) neighbours plus uniform noise whose amplitude starts at
    1e4 and shrinks by ``decay ** 2`` per octave: larger decay, smoother fog.
    """
    if size < 2 or size & (size - 1):
        raise ValueError(f"plasma_fractal: size must be a power of two >= 2, got {size}")
    m = np.zeros((n, size, size))
    step, amp = size, 1e4
    while step >= 2:
        half = step // 2
        corner = m[:, ::step, ::step]
        ring = corner + np.roll(corner, -1, axis=1)
        ring = ring + np.roll(ring, -1, axis=2)
        m[:, half::step, half::step] = ring / 4 + amp * rng.uniform(-1, 1, ring.shape)
        centre = m[:, half::step, half::step]
        top = centre + np.roll(centre, 1, axis=1) + corner + np.roll(corner, -1, axis=2)
        m[:, ::step, half::step] = top / 4 + amp * rng.uniform(-1, 1, top.shape)
        left = centre + np.roll(centre, 1, axis=2) + corner + np.roll(corner, -1, axis=1)
        m[:, half::step, ::step] = left / 4 + amp * rng.uniform(-1, 1, left.shape)
        step, amp = half, amp / decay**2
    m -= m.min(axis=(1, 2), keepdims=True)
    return m / m.max(axis=(1, 2), keepdims=True)


def motion_blur_kernel(radius: float, sigma: float) -> np.ndarray:
    """ImageMagick's one-sided motion-blur weights: ``2 ceil(radius) + 1`` taps, summing to 1."""
    i = np.arange(2 * math.ceil(radius) + 1, dtype=np.float64)
    k = np.exp(-(i**2) / (2 * sigma**2))
    return k / k.sum()


def motion_blur_images(x: np.ndarray, radius: float, sigma: float, angles: np.ndarray) -> np.ndarray:
    """Blur each image of (N, H, W[, C]) along its own angle (degrees) with `motion_blur_kernel`.

    Tap ``i`` reads the pixel ``round(i cos a)`` columns and ``round(i sin a)`` rows away;
    reads past the border repeat the edge pixel.
    """
    n, h, w = x.shape[:3]
    k = motion_blur_kernel(radius, sigma)
    a = np.deg2rad(np.asarray(angles, dtype=np.float64)).reshape(n, 1, 1)
    rows, cols = np.arange(h).reshape(1, h, 1), np.arange(w).reshape(1, 1, w)
    batch = np.arange(n).reshape(n, 1, 1)
    out = np.zeros(x.shape, dtype=np.float64)
    for i, weight in enumerate(k):
        dx, dy = np.ceil(i * np.cos(a) - 0.5).astype(np.int64), np.ceil(i * np.sin(a) - 0.5).astype(np.int64)
        out += weight * x[batch, np.clip(rows + dy, 0, h - 1), np.clip(cols + dx, 0, w - 1)]
    return out


def clipped_zoom(x: np.ndarray, factor: float) -> np.ndarray:
    """Zoom the centre of each (N, H, W) map by ``factor`` (bilinear), cropped back to (H, W)."""
    h = x.shape[1]
    ch = int(math.ceil(h / factor))
    top = (h - ch) // 2
    z = ndimage.zoom(x[:, top:top + ch, top:top + ch], (1, factor, factor), order=1)
    trim = (z.shape[1] - h) // 2
    return z[:, trim:trim + h, trim:trim + h]


def frost_sheet(size: int, rng: np.random.Generator) -> np.ndarray:
    """A procedural frost texture (size, size, 3) in [0, 1]: our stand-in for the frost photographs.

    A fractal haze (frosted glass) under branching ice needles drawn at 4x resolution and
    box-downsampled (antialiased), tinted blue-white.
    """
    big = 4 * size
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(max(8, (size * size) // 90)):
        x0, y0 = rng.uniform(0, big, 2)
        angle, length = rng.uniform(0, 2 * np.pi), rng.uniform(0.1, 0.35) * big
        shade = int(rng.uniform(140, 255))
        _needle(draw, x0, y0, angle, length, shade, rng, depth=2)
    needles = np.asarray(canvas.resize((size, size), Image.BOX), dtype=np.float64) / 255.0
    pow2 = 1 << max(1, (size - 1).bit_length())
    haze = plasma_fractal(1, pow2, 1.6, rng)[0, :size, :size]
    level = np.clip(0.25 + 0.35 * haze + 0.9 * needles, 0.0, 1.0)
    return level[..., None] * np.array([0.86, 0.93, 1.0])


def _needle(draw, x0, y0, angle, length, shade, rng, depth):
    """One ice needle with side branches at +-60 degrees (recursively shorter)."""
    x1, y1 = x0 + length * np.cos(angle), y0 + length * np.sin(angle)
    draw.line([(x0, y0), (x1, y1)], fill=shade, width=2)
    if depth == 0:
        return
    for t in rng.uniform(0.2, 0.9, 3):
        side = angle + rng.choice((-1, 1)) * np.pi / 3
        _needle(draw, x0 + t * (x1 - x0), y0 + t * (y1 - y0), side, 0.35 * length, shade, rng, depth - 1)


# ---------------------------------------------------------------- the corruptions (float [0, 1] images)


def _brightness(x, c, rng):
    hsv = rgb_to_hsv(x)
    hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
    return hsv_to_rgb(hsv)


def _saturate(x, c, rng):
    hsv = rgb_to_hsv(x)
    hsv[..., 1] = np.clip(hsv[..., 1] * c[0] + c[1], 0, 1)
    return hsv_to_rgb(hsv)


def _contrast(x, c, rng):
    means = x.mean(axis=(1, 2), keepdims=True)  # per image and channel
    return (x - means) * c + means


def _speckle_noise(x, c, rng):
    return x + x * rng.normal(scale=c, size=x.shape)


def _fog(x, c, rng):
    n, h = x.shape[:2]
    pow2 = 1 << max(1, (h - 1).bit_length())
    fog = plasma_fractal(n, max(pow2, x.shape[2]), c[1], rng)[:, :h, :x.shape[2], None]
    top = x.max(axis=(1, 2, 3), keepdims=True)
    return (x + c[0] * fog) * top / (top + c[0])


def _motion_blur(x, c, rng):
    blurred = motion_blur_images(x, c[0], c[1], rng.uniform(-45, 45, len(x)))
    return np.round(blurred * 255) / 255  # ImageMagick returns 8-bit pixels


def _snow(x, c, rng):
    loc, scale, zoom, thresh, radius, sigma, keep = c
    n, h, w = x.shape[:3]
    layer = clipped_zoom(rng.normal(loc, scale, (n, h, w)), zoom)
    layer[layer < thresh] = 0
    layer = np.floor(np.clip(layer, 0, 1) * 255) / 255  # the published code stores it as an 8-bit PNG
    layer = np.round(motion_blur_images(layer, radius, sigma, rng.uniform(-135, -45, n)) * 255) / 255
    layer = layer[..., None]
    gray = (x @ np.array([0.299, 0.587, 0.114]))[..., None]
    x = keep * x + (1 - keep) * np.maximum(x, gray * 1.5 + 0.5)
    return x + layer + layer[:, ::-1, ::-1]


def _frost(x, c, rng, sheets: int = 5):
    n, h, w = x.shape[:3]
    size = 3 * max(h, w)
    textures = [frost_sheet(size, rng) for _ in range(sheets)]
    which = rng.integers(0, sheets, n)
    tops, lefts = rng.integers(0, size - h, n), rng.integers(0, size - w, n)
    crops = np.stack([textures[k][t:t + h, s:s + w] for k, t, s in zip(which, tops, lefts)])
    return c[0] * x + c[1] * crops


def _jpeg_compression(img: np.ndarray, c, rng) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=int(c))
    buf.seek(0)
    with Image.open(buf) as out:
        return np.asarray(out.convert("RGB"))


def _pixelate(img: np.ndarray, c, rng) -> np.ndarray:
    h, w = img.shape[:2]
    small = Image.fromarray(img).resize((int(w * c), int(h * c)), Image.BOX)
    return np.asarray(small.resize((w, h), Image.BOX))


_FLOAT: dict[str, Callable] = {
    "brightness": _brightness, "saturate": _saturate, "contrast": _contrast, "speckle_noise": _speckle_noise,
    "fog": _fog, "motion_blur": _motion_blur, "snow": _snow, "frost": _frost,
}
_PER_IMAGE: dict[str, Callable] = {"jpeg_compression": _jpeg_compression, "pixelate": _pixelate}


# ---------------------------------------------------------------- public entry point


def corruption_rng(name: str, severity: int, seed: int) -> np.random.Generator:
    """The generator of one (corruption, severity, seed): independent across names and seeds."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(severity)])


def corrupt(images: np.ndarray, name: str, severity: int = 3, *, seed: int = 0) -> np.ndarray:
    """Apply corruption ``name`` at ``severity`` (1-5) to uint8 RGB images.

    Args:
        images: uint8 (N, H, W, 3) or one (H, W, 3) image, channels last.
        name: one of `CORRUPTIONS`.
        severity: 1 (mild) to 5 (strong); FedL2P uses 3.
        seed: the same (images, name, severity, seed) always give the same output.

    Returns:
        uint8 array of the input's shape.

    Raises:
        ValueError: unknown corruption, severity outside 1-5, or images not uint8 RGB.
    """
    if name not in LEVELS:
        raise ValueError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    x = np.asarray(images)
    single = x.ndim == 3
    if single:
        x = x[None]
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be uint8 (N, H, W, 3) or (H, W, 3), got {x.dtype} {tuple(np.shape(images))}")
    c, rng = LEVELS[name][severity - 1], corruption_rng(name, severity, seed)
    out = np.empty_like(x)
    for s in range(0, len(x), _CHUNK):
        part = x[s:s + _CHUNK]
        if name in _PER_IMAGE:
            out[s:s + _CHUNK] = np.stack([_PER_IMAGE[name](img, c, rng) for img in part])
        else:
            y = _FLOAT[name](part.astype(np.float64) / 255.0, c, rng)
            # truncation, as published; the nudge keeps exact values exact through float round-off
            out[s:s + _CHUNK] = (np.clip(y, 0, 1) * 255 + 1e-7).astype(np.uint8)
    return out[0] if single else out
