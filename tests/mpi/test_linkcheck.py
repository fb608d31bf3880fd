"""The start-up link check (cluster/linkcheck.py) on 2 x 2, 1 x 4 and 4 x 1: every rank gets the same
measurement, positive where the job has that link class and None where it has none; its verdict
(link_classes.py) names the rates."""
import pytest

from tests.mpi.conftest import WORLD, cluster_fixture

pytestmark = pytest.mark.mpi

cluster = cluster_fixture([(2, "mpi"), (4, "mpi"), (1, "mpi")])


def test_every_rank_gets_the_same_link_classes(cluster):
    from granndis_hpc import link_classes
    from granndis_hpc.cluster.linkcheck import measure_links

    topo, _, _ = cluster
    links = measure_links(topo)
    assert WORLD.allgather(links) == [links] * WORLD.Get_size()
    assert (links["inter_Bps"] is None) == (topo.servers == 1)
    assert (links["intra_Bps"] is None) == (topo.ranks_per_server == 1)
    assert links["inter_both_Bps"] is None and links["inter_both"] == {}  # measured only when asked
    for key in ("inter_Bps", "intra_Bps"):
        assert links[key] is None or links[key] > 1e6  # at least 8 Mbit/s: MPI on one machine is far above
    text = link_classes.verdict(links)
    assert text.startswith("links: ") and ("one server" in text) == (topo.servers == 1)


def test_the_check_states_its_trials_and_the_rounds_cost(cluster):
    from granndis_hpc.cluster import linkcheck

    topo, _, _ = cluster
    links = linkcheck.measure_links(topo, both_ways=True)
    assert WORLD.allgather(links["inter_both"]) == [links["inter_both"]] * WORLD.Get_size()
    for name, key in (("inter", "inter_Bps"), ("inter_both", "inter_both_Bps"), ("intra", "intra_Bps")):
        stats = links[name]
        if links[key] is None:
            assert stats == {}
        else:
            assert linkcheck.MIN_TRIALS <= stats["trials"] <= linkcheck.MAX_TRIALS
            assert stats["best_Bps"] == links[key] >= stats["median_Bps"] > 0
    assert links["seconds"] > 0
    rounds = linkcheck.measure_rounds(topo, repeats=5)
    assert WORLD.allgather(rounds) == [rounds] * WORLD.Get_size()
    assert rounds["world_round_s"] > 0 and rounds["allreduce_s"] > 0 and rounds["repeats"] == 5
    assert (rounds["server_round_s"] > 0) == (topo.ranks_per_server > 1)
    text = linkcheck.link_check_text(links, rounds)
    assert text.startswith("link check: ") and "gradient all-reduce" in text
    assert ("no inter-server link" in text) == (topo.servers == 1)
    assert ("both ways at once" in text) == (topo.servers > 1)
