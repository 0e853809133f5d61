"""pytest plugin: run the collected tests in reverse order (the GPU suite in another order)."""


def pytest_collection_modifyitems(session, config, items):
    items.reverse()
