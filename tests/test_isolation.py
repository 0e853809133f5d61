"""The suite's isolation fixtures (tests/conftest.py): a test cannot change what the next one gets."""

import torch

_SEEN: dict[str, int] = {}


def test_a_test_that_changes_the_thread_count():
    # what a command run in-process leaves behind (`--threads`: 1 on a CPU device)
    _SEEN["before"] = torch.get_num_threads()
    torch.set_num_threads(1 if _SEEN["before"] != 1 else 2)
    assert torch.get_num_threads() != _SEEN["before"]


def test_the_next_test_gets_the_count_back():
    # in collection order this runs after the test above; alone (or reversed) there is nothing to check
    if "before" in _SEEN:
        assert torch.get_num_threads() == _SEEN["before"]
