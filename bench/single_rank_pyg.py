"""PyTorch Geometric's side of bench/bench_single_rank.py: the same three models from PyG's convolutions,
over a torch.sparse CSR ``adj_t`` of the same rows, with the same weights as granndis_hpc's model.

  sage     SAGEConv(aggr="mean"), ReLU and dropout between layers
  gcn      GCNConv(normalize=False) over the adjacency with granndis_hpc's GCN normalisation (self-loops
           included: LayerGraph.coo("gcn")), ReLU and dropout between layers
  ressage  ResSAGE+ (nn/models.py ResSAGE): encoder Linear, SAGEConv 0, then pre-norm residual blocks
           h = h + SAGEConv(dropout(relu(LayerNorm(h)))), out LayerNorm -> ReLU -> dropout -> head;
           --checkpoint recomputes each block in backward (torch.utils.checkpoint), as the trainer's
           --checkpoint-activations does.

Dropout is torch's (a generator draw), not the keyed masks: the masks differ, their statistics do not.
"""
from __future__ import annotations

import time
import warnings

import torch
import torch.nn.functional as F
import torch.utils.checkpoint


def adjacency(graph, kind):
    """torch.sparse CSR [n_dst, n_src] of a LayerGraph: its edges with weight 1 for "mean" (SAGEConv's
    mean reduces them), the normalised entries with self-loops for "gcn"."""
    with warnings.catch_warnings():  # torch's "beta" note on sparse CSR tensors
        warnings.simplefilter("ignore", UserWarning)
        shape = (int(graph.n_dst), int(graph.n_src))
        if kind == "mean":
            return torch.sparse_csr_tensor(graph.indptr, graph.indices, torch.ones(graph.indices.shape[0]), size=shape)
        rows, cols, vals = graph.coo("gcn")
        return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, size=shape).coalesce().to_sparse_csr()


class PygNet(torch.nn.Module):
    """One of sage, gcn, ressage from PyG's convs; widths as granndis_hpc's build_model builds them."""

    def __init__(self, name, in_features, hidden, num_classes, layers, dropout, checkpoint=False):
        from torch_geometric.nn import GCNConv, SAGEConv

        super().__init__()
        self.name, self.p, self.checkpoint = name, float(dropout), bool(checkpoint)
        if name == "ressage":
            self.encoder = torch.nn.Linear(in_features, hidden)
            self.convs = torch.nn.ModuleList(SAGEConv(hidden, hidden, aggr="mean") for _ in range(layers))
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden) for _ in range(layers - 1))
            self.out_norm = torch.nn.LayerNorm(hidden)
            self.head = torch.nn.Linear(hidden, num_classes)
            return
        widths = [in_features] + [hidden] * (layers - 1) + [num_classes]
        make = {"sage": lambda a, b: SAGEConv(a, b, aggr="mean"), "gcn": lambda a, b: GCNConv(a, b, normalize=False)}
        self.convs = torch.nn.ModuleList(make[name](a, b) for a, b in zip(widths[:-1], widths[1:]))

    def _drop(self, h):
        return F.dropout(F.relu(h), self.p, self.training)

    def forward(self, x, adj):
        if self.name != "ressage":
            h = x
            for i, conv in enumerate(self.convs):
                h = conv(h if i == 0 else self._drop(h), adj)
            return h
        h = self.convs[0](self.encoder(x), adj)
        for conv, norm in zip(self.convs[1:], self.norms):
            def block(h, conv=conv, norm=norm):
                return h + conv(self._drop(norm(h)), adj)
            if self.checkpoint and self.training and torch.is_grad_enabled():
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        return self.head(self._drop(self.out_norm(h)))

    @torch.no_grad()
    def copy_from(self, ours):
        """Take granndis_hpc's model's weights (nn/models.py names), so both compute the same function."""
        for pyg, conv in zip(self.convs, ours.convs):
            if self.name == "gcn":
                pyg.lin.weight.copy_(conv.lin.weight)
                pyg.bias.copy_(conv.bias)
            else:  # PyG: lin_l (neighbours, with the bias) + lin_r (the vertex itself)
                pyg.lin_l.weight.copy_(conv.lin_neigh.weight)
                pyg.lin_r.weight.copy_(conv.lin_self.weight)
                pyg.lin_l.bias.copy_(conv.lin_self.bias)
        if self.name == "ressage":
            for mine, theirs in ((self.norms, ours.norms), (self.encoder, ours.encoder),
                                 (self.out_norm, ours.out_norm), (self.head, ours.head)):
                mine.load_state_dict(theirs.state_dict())
        return self


class PygEpoch:
    """Full-graph training epochs of a PygNet over the trainer's own rows, labels and training split (Adam)."""

    def __init__(self, trainer, args):
        view = trainer.world_view
        ds = trainer.manifest["dataset"]
        self.net = PygNet(args.model, int(ds["num_features"]), args.hidden, int(ds["num_classes"]), args.layers,
                          args.dropout, checkpoint=args.model == "ressage").copy_from(trainer.model).train()
        self.adj = adjacency(view.graphs[0], "gcn" if args.model == "gcn" else "mean")
        self.x, self.labels, self.train = view.input_features, trainer.labels, trainer.split_rows["train"]
        self.name = "pyg-csr"
        self.opt = torch.optim.Adam(self.net.parameters(), lr=0.01)

    def epoch(self):
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        logits = self.net(self.x, self.adj)
        F.cross_entropy(logits[self.train], self.labels[self.train]).backward()
        self.opt.step()
        return time.perf_counter() - start
