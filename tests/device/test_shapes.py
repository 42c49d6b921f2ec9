"""How far the device layer pads a batch: few shapes where graphs compile, a fine step on an eager CPU."""

from __future__ import annotations

from portachat.device.shapes import fine_buckets, pad_bucket, row_bucket


def test_coarse_buckets_pad_little_with_few_shapes():
    shapes = {pad_bucket(n, 2048) for n in range(1, 2049)}
    assert len(shapes) <= 16 and max(shapes) == 2048
    for n in range(1, 2049):
        b = pad_bucket(n, 2048)
        assert n <= b <= 2048 and b % 64 == 0
        assert b - n < max(64, n / 4)  # under a step of 64, or a quarter of the row
    assert [pad_bucket(n, 2048) for n in (1, 64, 65, 250, 600, 1100, 2000)] == [64, 64, 128, 256, 640, 1280, 2048]


def test_buckets_never_pass_the_row_length():
    assert pad_bucket(100, 90) == 90 and pad_bucket(250, 250) == 250 and pad_bucket(250, 250, fine=True) == 250


def test_an_eager_cpu_pads_to_a_multiple_of_16_only():
    assert fine_buckets("cpu", compiled=False) and not fine_buckets("cpu", compiled=True)
    assert not fine_buckets("cuda", compiled=False)
    assert row_bucket("cpu", False)(250, 2048) == 256 and row_bucket("cpu", False)(257, 2048) == 272
    assert row_bucket("cuda", True)(257, 2048) == 320
