"""Ledger: per (link, phase) byte and second counters, snapshots, reset, and reduction over ranks."""
import time

import pytest
from mpi4py import MPI

from granndis_hpc.cluster.ledger import LINKS, PHASES, Ledger


def test_add_accumulates_per_link_and_phase():
    ledger = Ledger()
    ledger.add("intra", "halo", 100, 0.5)
    ledger.add("intra", "halo", 28)
    ledger.add("inter", "gradient", 7, 0.25)
    assert ledger.bytes("intra", "halo") == 128
    assert ledger.seconds("intra", "halo") == pytest.approx(0.5)
    assert ledger.bytes("inter", "gradient") == 7
    assert ledger.bytes("inter", "halo") == 0
    assert ledger.total_bytes() == 135
    assert ledger.total_bytes("intra") == 128
    assert ledger.total_bytes(phase="gradient") == 7
    assert ledger.total_seconds("inter") == pytest.approx(0.25)


def test_snapshot_layout_and_reset():
    ledger = Ledger()
    ledger.add("inter", "evaluation", 3, 1.0)
    snap = ledger.snapshot()
    assert set(snap) == {"bytes", "seconds"}
    assert list(snap["bytes"]) == list(LINKS)
    assert list(snap["bytes"]["intra"]) == list(PHASES)
    assert snap["bytes"]["inter"]["evaluation"] == 3 and isinstance(snap["bytes"]["inter"]["evaluation"], int)
    assert snap["seconds"]["inter"]["evaluation"] == 1.0
    ledger.reset()
    assert ledger.total_bytes() == 0 and ledger.total_seconds() == 0.0
    assert snap["bytes"]["inter"]["evaluation"] == 3  # a snapshot is a copy


def test_timed_adds_elapsed_seconds_and_synchronises():
    calls = []
    ledger = Ledger(synchronize=lambda: calls.append(1))
    with ledger.timed("intra", "setup"):
        time.sleep(0.02)
    assert 0.015 < ledger.seconds("intra", "setup") < 1.0
    assert ledger.bytes("intra", "setup") == 0
    assert len(calls) == 2  # before starting and before stopping the clock


def test_timed_counts_time_even_when_the_body_raises():
    ledger = Ledger()
    with pytest.raises(KeyError):
        with ledger.timed("inter", "halo"):
            raise KeyError("boom")
    assert ledger.seconds("inter", "halo") > 0


@pytest.mark.parametrize("link,phase", [("intra-server", "halo"), ("intra", "forward")])
def test_unknown_names_are_rejected_with_the_valid_ones(link, phase):
    ledger = Ledger()
    with pytest.raises(ValueError, match="use one of"):
        ledger.add(link, phase, 1)
    with pytest.raises(ValueError, match="use one of"):
        ledger.bytes(link, phase)


def test_negative_entries_are_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        Ledger().add("intra", "halo", -1)


def test_reduce_over_a_single_rank_returns_the_snapshot():
    ledger = Ledger()
    ledger.add("intra", "halo", 5, 0.5)
    ledger.add("inter", "gradient", 9, 0.25)
    assert ledger.reduce(MPI.COMM_SELF) == ledger.snapshot()
    assert ledger.reduce(MPI.COMM_SELF, op="max") == ledger.snapshot()
    with pytest.raises(ValueError, match="'sum' or 'max'"):
        ledger.reduce(MPI.COMM_SELF, op="mean")


def test_gather_bytes_and_record_classes_of_one_rank():
    ledger = Ledger()
    ledger.add("intra", "halo", 5)
    ledger.add("intra", "setup", 2)  # per-step planning inside an epoch counts as halo
    ledger.add("inter", "halo", 11)
    ledger.add("inter", "gradient", 9)
    ledger.add("inter", "evaluation", 1000)  # not training traffic
    table = ledger.gather_bytes(MPI.COMM_SELF)
    assert table.shape == (1, len(LINKS), len(PHASES)) and table.dtype.kind == "i"
    classes = Ledger.record_classes(table)
    assert {k: v.tolist() for k, v in classes.items()} == {
        "intra_halo": [7], "inter_halo": [11], "intra_grad": [0], "inter_grad": [9]}
