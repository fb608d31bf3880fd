"""`preprocess plan`'s note on a dominated option names the inter-server bytes per epoch of its own table
(the total of halo and gradient bytes, not that total counted twice)."""
import re

from granndis_hpc import memory_model as mm
from granndis_hpc.preprocess.plan.command import PlanConfig, format_table


def _option(mode, k, peak, halo, grad):
    return mm.Option(mode=mode, k=k, peak=peak, rows_per_gpu=10,
                     inter_server_bytes={"halo": halo, "gradient": grad, "total": halo + grad})


def test_the_dominated_note_gives_the_table_s_bytes():
    fb, flx1 = _option("fb", 0, 1000, 3000, 200), _option("flx", 1, 2000, 3000, 200)
    decision = mm.choose([fb, flx1], 10)  # nothing fits: the reason names the dominated option
    text = format_table([fb, flx1], PlanConfig(servers=2, gpus_per_server=1, layers=2, budget=10), decision)
    note = re.search(r"dominated by fb: .* per GPU, ([\d,]+) <= ([\d,]+) inter-server bytes", text)
    assert note, text
    assert note.groups() == ("3,200", "3,200"), text
    assert re.search(r"^fb .* 3,200 +3,000 \+ +200 ", text, re.M), text
