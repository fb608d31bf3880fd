"""cluster/syncops.py through SyncCounter(ops=True): the operators that synchronise inside torch's C++
code on a GPU, recognised on CPU tensors by name (the rule table), each with the line that issued it, in
the forward and in the backward (torch's own nodes placed at the forward line that made them, a Python
autograd.Function's backward at its own line), and nothing from other threads or torch's optimizers."""
import os
import threading

import numpy as np
import torch

from granndis_hpc.cluster.hostsync import SyncCounter
from granndis_hpc.cluster.syncops import SYNCING_OPS

HERE = os.path.dirname(os.path.abspath(__file__))


def _line(tag):
    """The line of this file that ends with `# <tag>`."""
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {tag}"))


def _where(tag):
    return f"unit/test_syncops.py:{_line(tag)}"


def test_each_syncing_operator_is_recorded_once_with_its_line():
    t, idx = torch.tensor([0.0, 2.0, -1.0, 3.0]), torch.tensor([0, 2])
    with SyncCounter(package=HERE, ops=True) as counter:
        t.nonzero()  # nonzero
        t[t > 0]  # mask
        t[t > 0] = 1.0  # mask-put
        torch.masked_select(t, t > 1)  # masked-select
        torch.unique(idx)  # unique
        torch.repeat_interleave(idx)  # repeat
        torch.repeat_interleave(idx, idx, output_size=2)  # sized: not counted
        t[np.array([0, 2])]  # numpy
        t[[1, 3]]  # list
        t[idx], t.index_select(0, idx)  # device index: not counted
        float(t.sum())  # float
        t.sum().item()  # item
        torch.bincount(idx)  # bincount
        torch.equal(t, t)  # equal
    want = [("aten.nonzero", "nonzero"), ("aten.index", "mask"), ("aten.index_put_", "mask-put"),
            ("aten.masked_select", "masked-select"), ("aten._unique2", "unique"),
            ("aten.repeat_interleave", "repeat"), ("aten.lift_fresh", "numpy"), ("aten.lift_fresh", "list"),
            ("__float__", "float"), ("item", "item"), ("aten.bincount", "bincount"), ("aten.equal", "equal")]
    assert counter.calls == [(name, _where(tag)) for name, tag in want]


def test_the_backward_is_seen_at_the_forward_line_that_made_its_node():
    x = torch.randn(6, 3, requires_grad=True)

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return 2 * a

        @staticmethod
        def backward(ctx, g):
            g.sum().item()  # custom-backward
            return 2 * g

    threads = set()
    x.register_hook(lambda g: threads.add(threading.get_ident()))
    with SyncCounter(package=HERE, ops=True) as counter:
        y = Twice.apply(x)[x[:, 0] > 0]  # forward-mask
        y.sum().backward()
    assert counter.calls == [("aten.index", _where("forward-mask")), ("aten.index_put", _where("forward-mask")),
                             ("item", _where("custom-backward"))]
    # On the CPU autograd runs a CPU graph's backward in the thread that called backward(); on a GPU it
    # is the device's thread, which the dispatch mode reaches as autograd's thread-local state.
    assert threads == {threading.get_ident()}
    assert not torch.is_anomaly_enabled()  # restored


def test_other_threads_torch_internals_and_code_outside_the_package_are_not_counted():
    t = torch.tensor([1.0, -1.0])
    with SyncCounter(package=HERE, ops=True) as counter:
        worker = threading.Thread(target=lambda: (t.nonzero(), t.sum().item()))
        worker.start()
        worker.join()
        step = torch.zeros((), requires_grad=True)
        opt = torch.optim.Adam([step], lr=0.1)  # Adam reads its host-side step count with .item()
        step.backward()
        opt.step()
    assert counter.calls == []
    with SyncCounter(ops=True) as counter:  # granndis_hpc's code only
        t.nonzero()
    assert counter.calls == []


def test_without_ops_the_counter_keeps_its_python_level_rules():
    t = torch.tensor([1.0, -1.0])
    with SyncCounter(package=HERE) as counter:
        t.nonzero(), t[t > 0], t.sum().item()  # python-only
    assert counter.calls == [("item", _where("python-only"))]


def test_the_rule_table_names_aten_operators():
    for name in SYNCING_OPS:
        assert hasattr(torch.ops.aten, name), name
