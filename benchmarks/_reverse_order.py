"""pytest plugin: run the collected tests in reverse order (`-p benchmarks._reverse_order`), so that a
test that passes only after, or only before, another one shows up (benchmarks/gpu_suite.sh)."""


def pytest_collection_modifyitems(session, config, items):
    items.reverse()
