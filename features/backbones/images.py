"""Host-side image decoding shared by the image backbones.

Pure functions over one item (no model, no torch): they run per item so a corrupt image raises
its own ``BackboneError`` and the rest of the batch still encodes.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from .base import BackboneError

#: Decoded images above this many pixels are refused before resizing (a 4k x 4k photo is fine;
#: a decompression bomb is not). Pillow's own guard only warns below 2x its limit. The absolute
#: ceiling of any caller; the featurizer refuses far smaller images first (``image_pixels``,
#: ``UNLEARN_MAX_IMAGE_PIXELS``).
MAX_PIXELS = 64_000_000


def image_pixels(data: bytes) -> int | None:
    """Width x height an encoded image declares in its header, read without decoding (None when
    the header does not parse: decoding will refuse it). Why: what a worker must allocate to
    decode an image is its pixel count, not its size on the wire (an 8000 x 8000 PNG of zeros is
    182 KB), so a budget is checked before anything is decoded."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
    except Exception:
        return None
    return int(w) * int(h)


def decode_image(item: Any, size: int) -> np.ndarray:
    """Decode one image input to uint8 RGB of shape (size, size, 3).

    Accepts encoded bytes (PNG, JPEG, ... anything Pillow reads), a PIL image, or a uint8 array
    of shape (H, W), (H, W, 1) or (H, W, 3). Grayscale is replicated to 3 channels because the
    pretrained stems expect RGB. Non-square images are resized to a square without cropping
    (Fashion-MNIST and the demos are square; cropping policy would be a model choice).
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        if not data:
            raise BackboneError("empty image bytes")
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.draft("RGB", (size, size))  # JPEG: decode at a reduced scale (1/2..1/8); others: no-op
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise BackboneError(f"image too large: {w}x{h} > {MAX_PIXELS} pixels")
                im.load()  # force full decode so truncated files fail here, per item
                img = im.convert("RGB")
        except BackboneError:
            raise
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise BackboneError(f"undecodable image bytes ({type(exc).__name__}: {exc})") from exc
    elif isinstance(item, Image.Image):
        img = item.convert("RGB")
    elif isinstance(item, np.ndarray):
        img = Image.fromarray(_as_rgb_array(item))
    else:
        raise BackboneError(
            f"unsupported image input type {type(item).__name__}; "
            "expected encoded bytes, a PIL image or a uint8 array"
        )
    if img.size != (size, size):
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    out = np.asarray(img, dtype=np.uint8)
    return out


def _as_rgb_array(arr: np.ndarray) -> np.ndarray:
    """Validate a uint8 image array and return it as contiguous (H, W, 3)."""
    if arr.dtype != np.uint8:
        raise BackboneError(f"image array dtype must be uint8, got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise BackboneError(f"image array shape must be (H, W), (H, W, 1) or (H, W, 3), got {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise BackboneError(f"empty image array {arr.shape}")
    if arr.shape[0] * arr.shape[1] > MAX_PIXELS:
        raise BackboneError(f"image too large: {arr.shape[1]}x{arr.shape[0]} > {MAX_PIXELS} pixels")
    return np.ascontiguousarray(arr)
