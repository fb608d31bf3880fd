import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tests use tiny graphs: a second intra-op thread only adds spin-waiting, which on a shared 2-core
    machine turned a 5 s test into 100 s (measured).  Restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
