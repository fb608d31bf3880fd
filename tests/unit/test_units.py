import pytest

from granndis_hpc.units import format_size, parse_size


@pytest.mark.parametrize("text,expected", [("40GiB", 40 << 30), ("512 MiB", 512 << 20), ("16GB", 16 * 10 ** 9),
                                           ("1.5e9", 1_500_000_000), (4096, 4096), ("2k", 2000), ("1TiB", 1 << 40)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-5GiB", "0", True, "1.2.3G"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size():
    assert format_size(512) == "512 B"
    assert format_size(40 << 30) == "40 GiB"
    assert format_size(1.5 * (1 << 20)) == "1.5 MiB"
