"""A tiny heterogeneous graph written in DistDGL's chunked graph format (metadata.json, edge files of
per-type "src dst" ids as text or .npy, node data .npy chunks), with the arrays it was written from, so
tests compare what the reader builds against `canonicalize_hetero` of those arrays."""
import json

import numpy as np

COUNTS = {"paper": 40, "author": 25, "field": 6, "institution": 4}
WIDTH, CLASSES = 8, 3


def graph_arrays(seed: int = 0, field_width: int = WIDTH) -> dict:
    """canonicalize_hetero's arguments: papers carry features, labels and splits, fields features
    (`field_width` wide: another width than the papers' makes types of different widths); authors and
    institutions none (authors derive them from papers, institutions from authors)."""
    rng = np.random.default_rng(seed)
    n = COUNTS
    cites = rng.integers(0, n["paper"], (2, 90))
    writes = np.stack([rng.integers(0, n["author"], 70), rng.integers(0, n["paper"], 70)])
    topic = np.stack([np.arange(n["paper"]), rng.integers(0, n["field"], n["paper"])])
    affiliated = np.stack([np.arange(n["author"]), rng.integers(0, n["institution"], n["author"])])
    relations = {("author", "writes", "paper"): writes, ("paper", "cites", "paper"): cites,
                 ("paper", "has_topic", "field"): topic, ("author", "affiliated_with", "institution"): affiliated}
    labels = rng.integers(0, CLASSES, n["paper"])
    labels[:3] = -1  # unlabelled papers, in no split
    order = 3 + rng.permutation(n["paper"] - 3)
    masks = [np.zeros(n["paper"], bool) for _ in range(3)]
    for m, part in zip(masks, np.split(order, [20, 28])):
        m[part] = True
    features = {"paper": rng.normal(size=(n["paper"], WIDTH)).astype(np.float32),
                "field": rng.normal(size=(n["field"], field_width)).astype(np.float32)}
    return dict(counts=dict(n), features=features, relations=relations, labels=labels,
                splits=dict(zip(("train", "val", "test"), masks)), target="paper")


def _chunks(rows: int, parts: int) -> list:
    return [rows * (i + 1) // parts - rows * i // parts for i in range(parts)]


def write_distdgl_hetero(root, per_chunk: bool = False, seed: int = 0, field_width: int = WIDTH) -> dict:
    """The graph of `graph_arrays(seed)` under root in DistDGL's layout; returns those arrays.
    `per_chunk`: counts as DGL's chunk_graph.py writes them (num_nodes_per_chunk / num_edges_per_chunk)."""
    g = graph_arrays(seed, field_width)
    (root / "edges").mkdir(parents=True)
    (root / "node_data").mkdir()
    meta = {"graph_name": "tiny-hetero", "node_type": list(g["counts"]), "edge_type": [], "edges": {},
            "node_data": {}}
    node_chunks = {t: _chunks(c, 2) for t, c in g["counts"].items()}
    edge_chunks = []
    for k, ((s, r, d), e) in enumerate(g["relations"].items()):
        et = f"{s}:{r}:{d}"
        meta["edge_type"].append(et)
        sizes = _chunks(e.shape[1], 2)
        edge_chunks.append(sizes)
        files, start = [], 0
        for i, size in enumerate(sizes):
            part = e[:, start:start + size].T
            start += size
            if k == 1:  # one relation as .npy, the others as DGL writes them (text, space-separated)
                name = f"edges/{r}-{i}.npy"
                np.save(root / name, part)
            else:
                name = f"edges/{r}-{i}.txt"
                np.savetxt(root / name, part, fmt="%d", delimiter=" ")
            files.append(name)
        fmt = {"name": "numpy"} if k == 1 else {"name": "csv", "delimiter": " "}
        meta["edges"][et] = {"format": fmt, "data": files}
    fields = {t: {"feat": x} for t, x in g["features"].items()}
    masks = {f"{s}_mask": m.astype(np.uint8 if s == "val" else bool) for s, m in g["splits"].items()}
    fields["paper"].update(label=g["labels"].reshape(-1, 1), **masks)
    for t, data in fields.items():
        meta["node_data"][t] = {}
        for key, arr in data.items():
            files, start = [], 0
            for i, size in enumerate(node_chunks[t]):
                name = f"node_data/{t}-{key}-{i}.npy"
                np.save(root / name, arr[start:start + size])
                start += size
                files.append(name)
            meta["node_data"][t][key] = {"format": {"name": "numpy"}, "data": files}
    if per_chunk:
        meta["num_nodes_per_chunk"] = [node_chunks[t] for t in g["counts"]]
        meta["num_edges_per_chunk"] = edge_chunks
    else:
        meta["num_nodes_per_type"] = list(g["counts"].values())
        meta["num_edges_per_type"] = [sum(c) for c in edge_chunks]
    meta["edge_data"] = {}
    (root / "metadata.json").write_text(json.dumps(meta, indent=1))
    return g


def reference(g: dict, symmetrize: bool = True):
    """The graph `canonicalize_hetero` makes of the arrays (the whole-graph definition)."""
    from granndis_hpc.preprocess.sources.hetero import canonicalize_hetero

    return canonicalize_hetero("tiny-hetero", g["counts"], g["features"],
                               {k: (e[0], e[1]) for k, e in g["relations"].items()}, g["labels"], g["splits"],
                               g["target"], symmetrize=symmetrize)
