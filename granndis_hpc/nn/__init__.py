"""Layers and models over a per-layer one-hop graph.  Pure torch: no MPI, no files (docs/design.md §3)."""
from .contract import Layer, LayerCall, ModelContract, PassSettings
from .dropout import RowDropout, keep_mask
from .graph import BACKENDS, DEFAULT_BACKEND, KINDS, GraphPart, LayerGraph, aggregate
from .layers import GCNConv, SAGEConv
from .models import GNN, MODELS, PlainGNN, ResSAGE, build_model

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "KINDS", "GraphPart", "LayerGraph", "aggregate", "GCNConv", "SAGEConv",
           "GNN", "Layer", "LayerCall", "MODELS", "ModelContract", "PassSettings", "PlainGNN", "ResSAGE", "build_model",
           "RowDropout", "keep_mask"]
