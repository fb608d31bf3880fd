"""docs/configuration.md is rendered from the option declarations (granndis_hpc/options/reference.py):
it must be the page the code renders now, and it must show each command's options with their rules."""
from pathlib import Path

from granndis_hpc.options import reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_page_is_current():
    assert PAGE.read_text() == reference.page(), (
        "docs/configuration.md is stale: run `python -m granndis_hpc.options.reference > docs/configuration.md`")


def test_the_page_renders_every_option_with_its_rules():
    from dataclasses import dataclass

    from granndis_hpc.options import Options, option

    @dataclass
    class Toy(Options):
        OPTIONS_GROUP = "toy"
        epochs: int = option(5, "training epochs", ge=1, on_resume="may_change")
        kind: str = option("a", choices=("a", "b"), help="a or b")
        fast: bool = option(False, help="go | fast")

    text = "\n".join(reference.render_class(Toy, resume_column=True))
    assert "| `--epochs` | int (>= 1) | `5` | may change | training epochs |" in text
    assert "| `--kind` | `a` \\| `b` | `a` | must match | a or b |" in text
    assert "| `--fast` | flag | off | must match | go \\| fast |" in text
    page = reference.page()
    for command, _, _ in reference.COMMANDS:
        assert f"## `{command}`" in page
    assert "`--preloaded-layers`" in page and "`--eas-fanout`" in page and "`--sweep`" in page
