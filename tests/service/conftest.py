import pytest

from tests.service.helpers import running_scheduler


@pytest.fixture(params=[1, 4], ids=lambda steps: f"steps={steps}")
def stepped_scheduler(request):
    """The scheduler with one plan a message, and with bundles of up to 4 decode steps
    (--num-scheduler-steps): a scenario that takes it runs under both."""
    with running_scheduler("--num-scheduler-steps", str(request.param)) as handle:
        yield handle
