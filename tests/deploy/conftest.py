"""The `docker` marker: tests that build the images and run docker-compose.yml in a Docker
engine (test_compose_live.py). `-m "not docker"` leaves them out of a quick local run."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "docker: builds the images and runs docker-compose.yml in a Docker engine "
        "(root starts one)",
    )
