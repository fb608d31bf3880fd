"""The start-up link check (cluster/linkcheck.py) and the rounds' check (cluster/roundcheck.py) on 2 x 2,
1 x 4 and 4 x 1: every rank gets the same measurement, positive where the job has that link class or
group and None (or 0) where it has none; its verdict (link_classes.py) names the rates."""
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
    from granndis_hpc.cluster import linkcheck, roundcheck

    topo, comm, _ = cluster
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
    rounds = roundcheck.measure_exchange_rounds(comm, repeats=5)
    assert WORLD.allgather(rounds) == [rounds] * WORLD.Get_size()
    assert rounds["world_round_s"] > 0 and rounds["allreduce_s"] > 0
    assert roundcheck.MIN_ROUNDS <= rounds["repeats"] <= 5 and rounds["seconds"] > 0
    assert (rounds["server_round_s"] > 0) == (topo.ranks_per_server > 1)
    text = linkcheck.link_check_text(links, rounds)
    assert text.startswith("link check: ") and "gradient all-reduce" in text
    assert "world overlapped, server blocking, gradient overlapped" in text
    assert ("no inter-server link" in text) == (topo.servers == 1)
    assert ("both ways at once" in text) == (topo.servers > 1)


def test_the_rounds_run_on_the_run_s_paths_and_leave_its_ledger_alone(cluster, monkeypatch):
    from granndis_hpc.cluster import roundcheck

    topo, comm, ledger = cluster
    before = ledger.snapshot()
    # no time budget: every rank stops after the fewest rounds, together (the all-reduce carries the flag)
    monkeypatch.setattr(roundcheck, "BUDGET_S", 0.0)
    # (the gradient's overlapped round is GradientSync's bucket: posted, polled, waited for; its sum carries
    # the flag, so stopping together checks it too)
    for overlapped in (False, True):
        rounds = roundcheck.measure_exchange_rounds(comm, world_overlapped=overlapped, server_overlapped=overlapped,
                                                    repeats=roundcheck.ROUNDS, gradient_overlapped=overlapped)
        assert rounds["repeats"] == roundcheck.MIN_ROUNDS
        assert WORLD.allgather(rounds) == [rounds] * WORLD.Get_size()
        assert (rounds["world_path"], rounds["server_path"], rounds["gradient_path"]) == (
            ("overlapped",) * 3 if overlapped else ("blocking",) * 3)
        assert rounds["world_round_s"] > 0 and (rounds["server_round_s"] > 0) == (topo.ranks_per_server > 1)
        assert rounds["allreduce_s"] > 0
    assert comm.ledger is ledger and ledger.snapshot() == before  # the check's bytes went to a scratch ledger
    with pytest.raises(ValueError, match="repeats must be at least"):  # refused on every rank before a message
        roundcheck.measure_exchange_rounds(comm, repeats=0)
