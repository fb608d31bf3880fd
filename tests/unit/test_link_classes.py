"""The words for a job's measured link classes (granndis_hpc/link_classes.py)."""
from granndis_hpc.link_classes import SLOW_LINK_RATIO, ratio, verdict


def test_a_fast_inter_server_link_says_fb_is_the_expected_winner():
    same_machine = {"inter_Bps": 2.0e9, "intra_Bps": 2.5e9}
    assert ratio(same_machine) == 1.25 < SLOW_LINK_RATIO
    text = verdict(same_machine)
    assert "inter-server 16.00 Gbit/s, intra-server 20.00 Gbit/s (1.2x the inter-server)" in text
    assert "fb is the expected winner" in text


def test_a_slow_inter_server_link_is_the_regime_graNNDis_is_for():
    ten_gbe = {"inter_Bps": 1.15e9, "intra_Bps": 32e9}  # the paper's testbed: about 28x
    text = verdict(ten_gbe)
    assert "(27.8x the inter-server)" in text and "expected winner" not in text
    assert "Mbit/s" in verdict({"inter_Bps": 11.5e6, "intra_Bps": 2e9})


def test_one_server_or_one_rank_per_server():
    assert "one server" in verdict({"inter_Bps": None, "intra_Bps": 3e9})
    assert ratio({"inter_Bps": 1e9, "intra_Bps": None}) is None
    assert verdict({"inter_Bps": 1e9, "intra_Bps": None}) == "links: inter-server 8.00 Gbit/s"


def test_the_link_check_says_its_trials_and_rounds():
    from granndis_hpc.cluster.linkcheck import link_check_text

    links = {"inter_Bps": 1.04e8, "intra_Bps": 5.7e8, "message_bytes": 512 << 10, "seconds": 1.2,
             "inter": {"trials": 12, "best_Bps": 1.04e8, "median_Bps": 9.1e7},
             "intra": {"trials": 7, "best_Bps": 5.7e8, "median_Bps": 4e8}}
    rounds = {"world_round_s": 0.012, "server_round_s": 0.004, "allreduce_s": 0.02, "repeats": 20}
    text = link_check_text(links, rounds)
    assert text.startswith("link check: inter-server 104 MB/s (best of 12 ping-pongs of 2 x 512 KiB round trips; "
                           "median 91)")
    assert "intra-server 570 MB/s (best of 7" in text and "1.2 s" in text
    assert text.endswith("world 12 ms, server 4 ms, gradient all-reduce 20 ms")
    both = {**links, "inter_both_Bps": 5.2e7, "inter_both": {"trials": 3, "best_Bps": 5.2e7, "median_Bps": 5e7}}
    assert ("median 91), both ways at once 52 MB/s each (best of 3 exchanges of 2 x 512 KiB each way; median 50), "
            "intra-server 570 MB/s") in link_check_text(both, rounds)
    assert "(mean of 20 small exchanges after compute, the slowest rank's)" in text  # a record of the MPI check
    engine = link_check_text(links, {**rounds, "repeats": 7, "world_path": "blocking", "server_path": "overlapped"})
    assert ("(mean of 7 of the run's own exchanges after compute, world blocking, server overlapped, the slowest "
            "rank's): world 12 ms, server 4 ms, gradient all-reduce 20 ms") in engine
    alone = link_check_text({"inter_Bps": None, "intra_Bps": 5e8, "inter": {}, "intra": {}})
    assert alone == "link check: no inter-server link, intra-server 500 MB/s"


def test_both_ways_rate_is_at_most_one_way():
    from granndis_hpc.cluster.linkcheck import both_ways_rate

    assert both_ways_rate({"inter_Bps": 1.36e6, "inter_both_Bps": 0.7e6}) == 0.7e6  # a shared budget
    assert both_ways_rate({"inter_Bps": 1.36e6, "inter_both_Bps": 1.4e6}) == 1.36e6  # full duplex, noise
    assert both_ways_rate({"inter_Bps": 1.36e6, "inter_both_Bps": None}) is None  # not measured
    assert both_ways_rate({"inter_Bps": None, "inter_both_Bps": None}) is None  # one server
