#!/usr/bin/env bash
# distributed checks: dist suite on NCCL, every dist_selftest defect, the same under torchrun, flight-recorder/DETAIL probes
# One rank per GPU (one GPU is a world of 1). Parts: DIST_STEPS (default "suite defects torchrun
# probes"); DIST_TIMEOUT: per-case timeout of the defects runs (default 30). Logs and run
# folders in $S; the tables (cases per rank, each group finding with the ranks at fault, time to
# finding, NVML orphan check) in $S/summary.txt.
DIST_STEPS=${DIST_STEPS:-suite defects torchrun probes}
want() { [[ " $DIST_STEPS " == *" $1 "* ]]; }
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" | tee "$S/versions.txt"
if command -v py-spy >/dev/null; then echo "py-spy: $(py-spy --version)"; else echo "py-spy: not installed"; fi

# 1. the dist suite: one rank per GPU, NCCL
if want suite; then
  t0=$SECONDS
  timeout 420 "$PY" -m gpucheck.cli run --distributed --all-devices --suite dist --timeout 300 \
    --out "$S/dist" --quiet >"$S/dist.log" 2>&1
  note "dist suite: rc=$? in $((SECONDS - t0)) s"
fi

# 2. every defect, each reported with the rank at fault within the timeout
if want defects; then
  t0=$SECONDS
  timeout 500 "$PY" -m gpucheck.cli run --distributed --all-devices --suite dist_selftest \
    --timeout "${DIST_TIMEOUT:-30}" --out "$S/defects" --quiet >"$S/defects.log" 2>&1
  rc=$?
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >"$S/apps_after.csv"
  note "dist defects: rc=$rc in $((SECONDS - t0)) s; compute apps after: $(( $(wc -l <"$S/apps_after.csv") - 1 ))"
fi

# 3. the same entry started by torchrun (one gpucheck process per rank): the dist suite, then a
#    skipped collective, a crash on one rank and the clean case after them
if want torchrun; then
  n=$(( NGPU > 0 ? NGPU : 1 ))
  t0=$SECONDS
  timeout 300 "$PY" -m torch.distributed.run --nnodes 1 --nproc-per-node "$n" \
    --master-port 29533 -m gpucheck.cli run --distributed --suite dist --timeout 300 \
    --out "$S/torchrun" --quiet >"$S/torchrun.log" 2>&1
  note "torchrun dist suite: rc=$? in $((SECONDS - t0)) s"
  t0=$SECONDS
  timeout 300 "$PY" -m torch.distributed.run --nnodes 1 --nproc-per-node "$n" \
    --master-port 29534 -m gpucheck.cli run --distributed --suite dist_selftest \
    --timeout "${DIST_TIMEOUT:-30}" --out "$S/torchrun-defects" --quiet \
    -- -k "skip_collective or crash_one_rank or clean" >"$S/torchrun-defects.log" 2>&1
  note "torchrun defects: rc=$? in $((SECONDS - t0)) s"
fi

# 4. probes: the flight recorder's dump as the watchdog reads it; DETAIL under DDP
if want probes; then
  timeout 120 "$PY" "$STEPS_DIR/verify/dist_probes.py" >"$S/probes.log" 2>&1
  note "dist probes: rc=$?"
  tail -8 "$S/probes.log"
fi

# 5. the tables
runs=(); for r in dist defects torchrun torchrun-defects; do [ -d "$S/$r" ] && runs+=("$S/$r"); done
[ ${#runs[@]} -gt 0 ] && tables dist "${runs[@]}" | tee "$S/summary.txt"
true
