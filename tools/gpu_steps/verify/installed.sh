#!/usr/bin/env bash
# gpucheck as a user installs it (sdist built at install; pure wheel built on first use), run from /tmp; needs DIST
# Run it last: it replaces the editable install (run `install` again after it).
#   sdist: `pip install --no-build-isolation` of the sdist (kernels built at install, for the
#          visible GPU), then `gpucheck run --all-devices` and `gpucheck selftest` from /tmp;
#   wheel: the pure wheel (no kernels) instead, then `gpucheck run --suite knn` twice from
#          /tmp: the first builds the kernels on first use (one progress line), the second
#          only loads them; then `pytest -n 2` on an empty cache (one build for both workers).
# The sdist and the wheel are built beforehand (`python -m build --outdir DIST`), no network
# is needed here. Settings: DIST (a folder with the sdist and the wheel), INSTALLED_STEPS
# (default "sdist wheel"), SELFTEST_ARGS (e.g. "--all-devices --sanitizer").
STEPS=${INSTALLED_STEPS:-sdist wheel}
step() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=$S
DIST=$(cd "${DIST:?set DIST to the folder of the sdist and the wheel}" && pwd) || exit 2
unset TORCH_CUDA_ARCH_LIST GPUCHECK_KERNELS  # the install must pick the visible GPU's architecture itself
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
$PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)" \
  | tee -a "$OUT/machine.txt"
where() { (cd / && $PY -c "import gpucheck, pathlib; print(pathlib.Path(gpucheck.__file__).parent)"); }
counts() { tables counts "$1"; }  # device x suite x mode x status of a run folder, findings

if step sdist; then
  rm -rf /tmp/gi-sdist && mkdir -p /tmp/gi-sdist && cd /tmp/gi-sdist
  t0=$SECONDS
  $PY -m pip install -v --no-build-isolation --no-deps "$DIST"/gpucheck-*.tar.gz \
    >"$OUT/sdist_install.log" 2>&1
  note "sdist install: rc=$? in $((SECONDS - t0)) s; gpucheck at $(where)"
  grep -E "gencode|arch=|gpucheck:" "$OUT/sdist_install.log" | grep -o "arch=compute_[0-9]*,code=sm_[0-9]*\|gpucheck: .*" | sort | uniq -c | head -5
  (cd / && $PY -c "import torch, gpucheck._C as c; print('prebuilt kernels:', c.__file__)")
  t0=$SECONDS
  gpucheck run --all-devices --out /tmp/gi-sdist/run >"$OUT/sdist_run.log" 2>&1
  note "sdist: gpucheck run --all-devices: rc=$? in $((SECONDS - t0)) s"; tail -3 "$OUT/sdist_run.log"
  counts /tmp/gi-sdist/run
  t0=$SECONDS
  # shellcheck disable=SC2086  # SELFTEST_ARGS: e.g. --sanitizer
  gpucheck selftest ${SELFTEST_ARGS:-} --out selftest >"$OUT/sdist_selftest.log" 2>&1
  note "sdist: gpucheck selftest ${SELFTEST_ARGS:-}: rc=$? in $((SECONDS - t0)) s"
  grep -E "│ .*(found|missed)|detected|false positive" "$OUT/sdist_selftest.log"
  ls /tmp/gi-sdist/reports 2>/dev/null && echo "UNEXPECTED: reports/ left in the cwd"
  tar czf "$OUT/sdist_runs.tgz" -C /tmp/gi-sdist run selftest 2>/dev/null
fi

if step wheel; then
  $PY -m pip uninstall -y -q gpucheck
  $PY -m pip install -q --no-deps "$DIST"/gpucheck-*-py3-none-any.whl
  rm -rf /tmp/gi-wheel /tmp/gi-cache && mkdir -p /tmp/gi-wheel && cd /tmp/gi-wheel
  export GPUCHECK_CACHE_DIR=/tmp/gi-cache
  echo "wheel installed at $(where)"
  for n in 1 2; do
    t0=$SECONDS
    gpucheck run --all-devices --suite knn --out "/tmp/gi-wheel/run$n" -- -k "matches_reference_small and uniform" \
      >"$OUT/wheel_run$n.log" 2>&1
    note "wheel run $n: rc=$? in $((SECONDS - t0)) s"
    grep -c "building the CUDA kernels" "$OUT/wheel_run$n.log" | sed 's/^/   progress lines: /'
    grep "gpucheck: building\|gpucheck: .*kernels" "$OUT/wheel_run$n.log" | head -3
    tail -1 "$OUT/wheel_run$n.log"
  done
  rm -rf /tmp/gi-cache
  t0=$SECONDS
  suites=$(cd / && $PY -c "from gpucheck import _resources; print(_resources.suites())")
  $PY -m pytest -n 2 -q -p no:cacheprovider "$suites/knn" -k "matches_reference_small and uniform" \
    >"$OUT/wheel_xdist.log" 2>&1
  note "wheel: pytest -n 2 on an empty cache: rc=$? in $((SECONDS - t0)) s"
  grep -c "building the CUDA kernels" "$OUT/wheel_xdist.log" | sed 's/^/   progress lines: /'
  tail -2 "$OUT/wheel_xdist.log"
  ls /tmp/gi-cache/*/ 2>/dev/null | head
fi
