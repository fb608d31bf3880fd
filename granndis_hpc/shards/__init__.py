"""Shard format v1: per-server HDF5 files + manifest.json (docs/design.md §5, docs/shard-format.md).

Readers (the engine) use read_manifest, check_job, verify_checksums and read_rank_slice; the
preprocess stage writes with prepare_output_dir / stage_server_file / commit_shard_set (or write_shards).
"""
from .content import check_job_content
from .manifest import check_job, manifest_digests, read_manifest, sha256_file, verify_checksums
from .reader import (RankSlice, open_server, read_rank_slice, read_server_arrays, read_server_features,
                     read_server_graph, read_server_rows, server_file)
from .schema import (DATASETS, FORMAT_VERSION, INDUCTIVE_DATASETS, MANIFEST_NAME, SPLIT_BITS, TRAIN_HOP_DATASETS,
                     TRAIN_HOP_UNREACHED, ShardError, datasets_of, has_train_hop, is_inductive, is_multilabel,
                     row_block_rows, server_file_name, split_code)
from .writer import (StagedFile, StreamedDataset, check_free_space, commit_shard_set, discard_staged,
                     estimate_file_bytes,
                     leftover_temporaries, lower_bound_set_bytes, prepare_output_dir, stage_server_file,
                     write_shards)

__all__ = [
    "FORMAT_VERSION", "MANIFEST_NAME", "DATASETS", "INDUCTIVE_DATASETS", "SPLIT_BITS", "ShardError", "server_file_name",
    "TRAIN_HOP_DATASETS", "TRAIN_HOP_UNREACHED", "datasets_of", "has_train_hop", "is_inductive", "is_multilabel",
    "row_block_rows", "split_code",
    "read_manifest", "check_job", "check_job_content", "verify_checksums", "sha256_file",
    "RankSlice", "open_server", "read_rank_slice", "read_server_arrays", "read_server_features",
    "read_server_graph", "read_server_rows", "server_file",
    "StagedFile", "StreamedDataset", "check_free_space", "estimate_file_bytes", "leftover_temporaries",
           "lower_bound_set_bytes",
    "manifest_digests", "prepare_output_dir", "stage_server_file", "commit_shard_set", "discard_staged", "write_shards",
]
