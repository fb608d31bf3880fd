"""What `pip install` puts into site-packages: one import name, granndis_hpc, with the repository's
preprocess/ folder as granndis_hpc.preprocess and nothing of the development tools (emucluster/,
slurm/testing/).  The wheel itself is tests/launch/test_installed_wheel.py's."""
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {"granndis_hpc": "granndis_hpc", "preprocess": "granndis_hpc.preprocess", "configs": "granndis_hpc.configs"}


def _setuptools():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_under_one_name():
    found = set()
    for folder, dotted in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((dotted,) + parts))
    listed = set(_setuptools()["packages"])
    assert listed == found, (f"pyproject.toml's packages: missing {sorted(found - listed)}, extra "
                             f"{sorted(listed - found)}")
    assert {p.split(".")[0] for p in listed} == {"granndis_hpc"}
    assert _setuptools()["package-dir"] == {"granndis_hpc.preprocess": "preprocess", "granndis_hpc.configs": "configs"}


def test_one_command_and_the_train_alias():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"granndis": "granndis_hpc.cli:main", "granndis-train": "granndis_hpc.cli:train_main"}
