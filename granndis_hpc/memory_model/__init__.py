"""Per-GPU memory model of a training plan, and the choice GraNNDis makes with it (paper §5.1):
the largest preloaded depth k that fits, then EAS, then cooperative batches.

No MPI, nothing from the engine, so `preprocess` can use it offline.  The parts:
- estimate.py: the pure estimate, `estimate(rows, model, device)` from row counts per layer (a
  `RankRows`); no I/O, no sampling, no torch; the model's share is its registered estimator;
- choice.py: `Option`s, the one ranking (`preference`, the modes' registry entries) and `choose`;
- arrays.py: row counts from shard arrays (`shard_rows`), NumPy only, through counts by hop
  (`HopCounts`, `WorldCounts`, `rank_rows`) that preprocess/plan/halo_counts.py counts from build slices;
- mode_estimates.py: each mode's `estimate` of a set (what its options train on; cob samples its co-batch);
- induced.py, induced_sets.py: an inductive run's evaluation views and slice, and the induced graphs'
  views counted from an inductive set's own arrays (--mode auto; plan counts them from build slices);
- payload.py: fb's and flx's partial payloads (--halo-payload partial | smaller): their counts per rank pair and bytes;
- host.py: on a CPU device, what a transductive rank's resident memory holds beyond its tensors (the
  process, its shard slice, cob's sampler index and next co-batch, the heap's holes);
- epoch_time.py: an option's predicted epoch time (`Rates`, `predict`) from its exact rows and bytes;
- shardsets.py: reading shard sets on disk (`estimate_shard_set`, `choose_shard_sets` for --mode auto);
- profile.py: measuring a step's peak with torch's profiler (tests and bench only; not imported here).

What a rank holds (on its device; on a CPU device also what host.py adds), for an L-layer model trained
with k preloaded hops (docs/memory-model.md has the formulas and the measurements):
- features: the static input rows of every view the run builds (own rows and the halo rows exchanged
  once at set-up): the server view (k >= 1) and the world view (always: exact evaluation uses it);
- graph: per LayerGraph indptr/indices/degrees, the cached normalised CSR adjacency (built by the
  first forward) and its cached transpose (built by the first backward, only where the aggregation's
  input needs a gradient), and the exchange's index tensors;
- parameters, their gradients and Adam's two moments;
- activations: what autograd keeps for the backward pass, per layer, derived from what each aten op
  saves and equal byte for byte to `SavedBytes` (tests/unit/test_memory_model.py);
- halo buffers and step transient: the step's peak above its activations (the exchange's send and
  receive rows, conv outputs, the current layer's gradients in the backward; after it, the flat
  all-reduce bucket and Adam's temporaries), the exchange's share reported as halo_buffers.
The estimate of a rank is the sum of these; an option's is the largest rank's.
"""

from .arrays import (GpuArrays, HopCounts, ServerArrays, WorldCounts, cobatch_counts, gpu_arrays_from_slice, rank_rows,
                     server_arrays_from_build, server_hop_counts, server_view_rows, shard_rows, view_rows_from_counts,
                     with_cobatch, world_counts, world_reads, relayed_by, server_inter_once)
from .choice import (Decision, Option, choose, choose_by_time, decision_table, drop_dominated, make_option, order_text,
                     preference, price, rows_held, sets_up_cobatches, setup_matters, setup_not_timed,
                     training_degree, training_shape)
from .epoch_time import Rates, predict
from .estimate import (LayerRows, MemoryModelError, ModelSpec, PeerCounts, RankRows, ViewRows, activation_layers,
                       check_rank_rows, estimate, inter_server_bytes, step_peak)
from .payload import halo_bytes, payload_check, payload_widths, peer_counts, refusal_note, with_payloads
from .mode_estimates import RowGroup, Sampling, SetArrays, cobatch_server_arrays, options, row_groups
from .shardsets import (ShardSetOptions, choose_shard_sets, estimate_shard_set, fitting_sets, model_for, read_shard_set,
                        set_arrays, shard_set_options)

__all__ = ["GpuArrays", "HopCounts", "ServerArrays", "WorldCounts", "cobatch_counts", "gpu_arrays_from_slice",
           "rank_rows",
           "server_arrays_from_build", "server_hop_counts", "server_view_rows", "shard_rows", "view_rows_from_counts",
           "with_cobatch", "world_counts", "world_reads", "relayed_by", "server_inter_once", "Decision", "Option",
           "choose", "choose_by_time", "decision_table", "Rates", "predict", "price", "drop_dominated",
           "make_option", "order_text", "preference", "rows_held", "sets_up_cobatches", "setup_matters",
           "setup_not_timed", "training_degree", "training_shape", "shard_set_options", "ShardSetOptions", "LayerRows",
           "MemoryModelError", "ModelSpec",
           "RankRows", "ViewRows", "activation_layers", "check_rank_rows", "estimate", "inter_server_bytes",
           "step_peak", "RowGroup", "Sampling", "SetArrays", "cobatch_server_arrays", "options", "row_groups",
           "choose_shard_sets", "estimate_shard_set", "fitting_sets", "model_for", "read_shard_set", "set_arrays",
           "PeerCounts", "halo_bytes", "payload_check", "payload_widths", "peer_counts", "refusal_note",
           "with_payloads"]
