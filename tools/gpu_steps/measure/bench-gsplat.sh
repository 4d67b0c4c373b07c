#!/usr/bin/env bash
# benchmarks/splat_vs_gsplat.py: our rasterizer and gsplat 1.5.3 side by side on one GPU (GSPLAT_WHEELS, GSPLAT_SO)
# A GPU machine without network: carry gsplat's wheel (`pip download --no-deps gsplat==1.5.3`;
# its needs jaxtyping, wadler-lindig, rich, ninja, numpy, packaging: carry their wheels too where
# missing) in $GSPLAT_WHEELS (default .gsplat). gsplat JIT-compiles its CUDA sources on first use
# (minutes) into $TORCH_EXTENSIONS_DIR/gsplat_cuda/gsplat_cuda.so (build/torch_extensions here,
# kept on a warm machine); pass that file as GSPLAT_SO to skip the compile on a fresh one.
# VS_ARGS: extra arguments of the benchmark (e.g. "--n 1000000 3000000 --repeats 30").
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ROOT/build/torch_extensions}
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gsplat-site \
  "${GSPLAT_WHEELS:-.gsplat}"/*.whl || exit 1
export PYTHONPATH=/tmp/gsplat-site${PYTHONPATH:+:$PYTHONPATH}
so_args=()
if [ -n "${GSPLAT_SO:-}" ]; then so_args=(--gsplat-so "$GSPLAT_SO"); fi
# shellcheck disable=SC2086  # VS_ARGS is split on purpose
timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/splat_vs_gsplat.py "${so_args[@]}" \
  --json "$S/vs_gsplat.json" ${VS_ARGS:-} >"$S/vs_gsplat.log" 2>&1
rc=$?
tail -40 "$S/vs_gsplat.log"
note "splat_vs_gsplat ${VS_ARGS:-}: rc=$rc (results: $S/vs_gsplat.json)"
exit "$rc"
