# Source this from the repository root on the GPU machine, before any GPU script's work:
#     source benchmarks/gpu_setup.sh || exit 1
# It installs the wheels the machine lacks from .whl/ (filled here by
# ../shared/tools/gpu-wheels.sh plus setuptools and wheel; carry .whl) into /tmp/site, then
# this checkout as an editable install: that is what maps kernels/ to requant.kernels and
# audit/ to requant.audit (pyproject.toml's package-dir), as on every other machine.
# REQUANT_WHEELS: another folder of wheels (e.g. one holding only nvidia-cutlass, setuptools, wheel).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${REQUANT_WHEELS:-.whl}"/*.whl || { echo "gpu_setup: installing ${REQUANT_WHEELS:-.whl}/*.whl failed" >&2; return 1; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    || { echo "gpu_setup: the editable install of $PWD failed" >&2; return 1; }
export REQUANT_CUTLASS_CACHE=${REQUANT_CUTLASS_CACHE:-/tmp/requant_cutlass} MAX_JOBS=${MAX_JOBS:-16}
