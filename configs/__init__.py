"""The presets: the GraNNDis artifact's settings per dataset, as options files (docs/paper-experiments.md).

Installed with the package as granndis_hpc.configs, so that ``--config NAME`` (``--config products``,
``--config products.build``) finds ``NAME.toml`` here on any installation; ``--config PATH`` reads a file.
"""
