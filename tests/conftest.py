import pytest

from tests.service.helpers import running_scheduler


@pytest.fixture
def scheduler():
    """A scheduler service running in this process (see `running_scheduler`)."""
    with running_scheduler() as handle:
        yield handle
