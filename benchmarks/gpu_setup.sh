# Source this from the repository root on the GPU machine, before any GPU script's work:
#     source benchmarks/gpu_setup.sh || exit 1
# It installs the wheels the machine lacks from .whl/ (filled here by
# ../shared/tools/gpu-wheels.sh plus setuptools and wheel; carry .whl) into /tmp/site, then
# this checkout as an editable install: that is what maps kernels/ to requant.kernels and
# audit/ to requant.audit (pyproject.toml's package-dir), as on every other machine.
# REQUANT_WHEELS: another folder of wheels (e.g. one holding only nvidia-cutlass, setuptools, wheel).
# The same wheels as the last call on this (warm) machine are not installed again: a reinstall rewrites
# the nvidia-cutlass headers, and their new mtimes made ninja rebuild the whole CUTLASS extension
# (50-60 s of every call; kernels/cutlass stage_sources keeps requant's own sources' mtimes).
# REQUANT_SITE (default /tmp/site): where they go.
_site=${REQUANT_SITE:-/tmp/site}
_wheels_stamp=$(sha256sum "${REQUANT_WHEELS:-.whl}"/*.whl | sha256sum | cut -c1-64)
if [ "$(cat "$_site/.requant-wheels" 2> /dev/null)" != "$_wheels_stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_site" \
        "${REQUANT_WHEELS:-.whl}"/*.whl || { echo "gpu_setup: installing ${REQUANT_WHEELS:-.whl}/*.whl failed" >&2; return 1; }
    mkdir -p "$_site" && echo "$_wheels_stamp" > "$_site/.requant-wheels"
else
    echo "gpu_setup: the wheels in $_site are this call's (stamp ${_wheels_stamp:0:12}); not reinstalled"
fi
export PYTHONPATH=$_site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    || { echo "gpu_setup: the editable install of $PWD failed" >&2; return 1; }
export REQUANT_CUTLASS_CACHE=${REQUANT_CUTLASS_CACHE:-/tmp/requant_cutlass} MAX_JOBS=${MAX_JOBS:-16}
