"""bench/hetero_page.py renders records of two models and the one-process reference, and
bench/hetero_pyg.py's PyG inputs hold every edge once, under its relation, with type-local ids."""
import importlib.util
import json

import numpy as np
import pytest
import torch

import hetero_page  # noqa: E402  (bench/ is on pytest's pythonpath: pyproject.toml)
import hetero_pyg
from granndis_hpc.preprocess.sources import load


def _run(epoch, inter=0.0):
    return {"epoch_s": epoch, "compute": epoch - inter, "sampling": 0.0, "intra_comm": 0.0, "inter_comm": inter,
            "grad_sync": 0.0, "bytes": {"intra_halo": 10, "inter_halo": 20 if inter else 0, "intra_grad": 3,
                                        "inter_grad": 4}, "peak_rss": [2**30] * 4}


def test_the_page_shows_each_model_its_speedups_and_the_reference():
    rounds = [{"label": "100mbit", "checks": {"rgcn": {"loadavg": 1.5}, "rgat": {"loadavg": 2.5}},
               "runs": {"rgcn/fb": _run(8.0, 6.0), "rgcn/flx": _run(2.0), "rgat/fb": _run(30.0, 12.0),
                        "rgat/flx": {"error": "timed out"}}}]
    records = {"models": ["rgcn", "rgat"], "modes": ["fb", "flx"], "vertices": 1000, "train": rounds,
               "plan": {"rgcn": {"fb": {"peak_bytes": 2**29}}},
               "reference": {"rgcn": {"epoch_s": 4.0, "peak_rss": 2**31}, "rgat": {"error": "no torch_geometric"}},
               "commands": ["python bench/bench_hetero.py --models rgat"], "log": ["a", "b", "a"]}
    page = hetero_page.render(records)
    assert page.startswith("# R-GCN and R-GAT on")
    assert "| 100mbit | 8.000 | 2.000 | **4.00x** | 75 % |" in page  # rgcn: fb 8 s, 6 s of it inter-server
    assert "| 100mbit | 30.000 | error |  | 40 % |" in page
    assert "| fb | 0.50 | 1.00 / 1.00 / 1.00 / 1.00 | 2.00 |" in page
    assert "| rgcn | 4.000 | 2.00 | 8.000 |" in page and "| rgat | error: no torch_geometric |  | 30.000 |" in page
    assert "rgcn 1.5, rgat 2.5" in page
    assert page.count("\na\n") == 1 and "python bench/bench_hetero.py --models rgat" in page


def test_the_pyg_inputs_hold_every_edge_under_its_relation():
    g = load("synthetic", generator="mag", vertices=3000, seed=1)
    x, x_dict, edges, edge_index, relation = hetero_pyg.typed_inputs(g)
    types, offsets = g.types, np.asarray(g.types.offsets)
    assert int((relation < 0).sum()) == 0 and sum(e.shape[1] for e in edges.values()) == len(g.indices)
    for r, rel in enumerate(types.relations):
        s, d = types.names.index(rel.src), types.names.index(rel.dst)
        e = edges[rel.key].numpy()
        mine = relation.numpy() == r
        assert np.array_equal(e[0] + offsets[s], edge_index[0].numpy()[mine])
        assert np.array_equal(e[1] + offsets[d], edge_index[1].numpy()[mine])
        assert x_dict[rel.src].shape[0] == types.count(rel.src)
    assert x.shape == (g.num_vertices, g.num_features)


@pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="needs torch_geometric")
def test_the_pyg_reference_trains_both_models(tmp_path):
    threads = torch.get_num_threads()  # main sets torch's threads for the process
    try:
        for model in ("rgcn", "rgat"):
            out = tmp_path / f"{model}.json"
            assert hetero_pyg.main(["--vertices", "600", "--model", model, "--hidden", "8", "--epochs", "2",
                                    "--json", str(out)]) == 0
            rec = json.loads(out.read_text())
            assert rec["vertices"] == 600 and len(rec["epoch_times"]) == 2 and rec["epoch_s"] > 0
    finally:
        torch.set_num_threads(threads)
