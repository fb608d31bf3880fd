"""The messages one block between servers travels in (cluster/layout.py; the world exchange's blocks, the
leaders' gradient buckets): under the eager limit, covering it exactly."""
import pytest

from granndis_hpc.cluster.layout import MESSAGE_PIECE_BYTES, message_pieces, piece_bytes_setting


def test_pieces_cover_the_block_in_messages_of_at_most_the_limit():
    assert MESSAGE_PIECE_BYTES == 32768
    # 20,000 float32 = 80,000 bytes: 8,192 elements (32,768 bytes) a message, the last 3,616
    assert message_pieces(20000, 4) == [(0, 8192), (8192, 16384), (16384, 20000)]
    # float64: 4,096 elements a message; exactly two full messages
    assert message_pieces(8192, 8) == [(0, 4096), (4096, 8192)]
    assert message_pieces(5, 2) == [(0, 5)]
    assert message_pieces(0, 4) == [(0, 0)]  # an empty bucket still pairs one message each way
    # bytes of a world-exchange block (items of one byte): message ends need not fall between rows
    assert message_pieces(67200, 1) == [(0, 32768), (32768, 65536), (65536, 67200)]
    assert message_pieces(3, 40000) == [(0, 1), (1, 2), (2, 3)]  # an item over the limit: one a message


def test_another_piece_size_or_one_message_a_block():
    assert message_pieces(2500, 1, 1000) == [(0, 1000), (1000, 2000), (2000, 2500)]
    assert message_pieces(20000, 4, 0) == [(0, 20000)]  # 0: the whole block in one message
    assert message_pieces(0, 4, 0) == [(0, 0)]
    # one message a block, but never past MPI's int count (a block of bytes over 2 GiB)
    big = 2**31 + 5
    assert message_pieces(big, 1, 0) == [(0, 2**31 - 1), (2**31 - 1, big)]


def test_the_piece_size_setting():
    assert piece_bytes_setting("") == piece_bytes_setting("  ") == MESSAGE_PIECE_BYTES
    assert piece_bytes_setting("0") == 0 and piece_bytes_setting("65536") == 65536
    for bad in ("32k", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"GRANNDIS_MESSAGE_PIECE_BYTES={bad!r}: give a whole number"):
            piece_bytes_setting(bad)
