"""The leaders' messages of one bucket (cluster/allreduce.py): under the eager limit, covering it exactly."""
from granndis_hpc.cluster.allreduce import LEADERS_MESSAGE_BYTES, leaders_pieces


def test_pieces_cover_the_bucket_in_messages_of_at_most_the_limit():
    assert LEADERS_MESSAGE_BYTES == 32768
    # 20,000 float32 = 80,000 bytes: 8,192 elements (32,768 bytes) a message, the last 3,616
    assert leaders_pieces(20000, 4) == [(0, 8192), (8192, 16384), (16384, 20000)]
    # float64: 4,096 elements a message; exactly two full messages
    assert leaders_pieces(8192, 8) == [(0, 4096), (4096, 8192)]
    assert leaders_pieces(5, 2) == [(0, 5)]
    assert leaders_pieces(0, 4) == [(0, 0)]  # an empty bucket still pairs one message each way
