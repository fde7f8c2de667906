"""Image decoding bounds (``features/backbones/images.py``): the pixel count is read from the header
before anything is decoded; a JPEG decodes at a reduced scale near the backbone's size."""

from __future__ import annotations

import io

import numpy as np

from unlearn.features.backbones.images import decode_image, image_pixels


def _encoded(w: int, h: int, fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 90)).save(buf, format=fmt)
    return buf.getvalue()


def test_the_pixel_count_comes_from_the_header() -> None:
    assert image_pixels(_encoded(300, 200, "PNG")) == 60_000
    assert image_pixels(_encoded(64, 48, "JPEG")) == 3072
    assert image_pixels(b"not an image") is None and image_pixels(b"") is None


def test_a_large_jpeg_decodes_at_a_reduced_scale_to_the_same_size() -> None:
    from PIL import Image

    data = _encoded(4000, 3000, "JPEG")
    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (112, 112))
        assert im.size[0] * im.size[1] < 4000 * 3000 // 16  # what decode_image allocates
    out = decode_image(data, 112)
    assert out.shape == (112, 112, 3) and out.dtype == np.uint8
    assert abs(int(out[56, 56, 0]) - 200) <= 3  # the same flat colour
