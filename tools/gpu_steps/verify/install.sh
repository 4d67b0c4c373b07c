#!/usr/bin/env bash
# editable install of the checkout, kernels $GPUCHECK_KERNELS for $TORCH_CUDA_ARCH_LIST; machine and versions
# Needed once per machine before the other steps, of every kind (installed replaces it: run
# install again after that one). Logs: build.log, machine.txt.
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$S/machine.txt"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())" | tee -a "$S/machine.txt"
t0=$SECONDS
"$PY" -m pip install -v --no-deps --no-build-isolation -e . >"$S/build.log" 2>&1 \
  && "$PY" -c "import torch, gpucheck._C" || { tail -40 "$S/build.log"; exit 1; }
grep -a "gpucheck: not building\|building with" "$S/build.log" | sort -u | head -3
note "install: kernels ${GPUCHECK_KERNELS}, $NGPU GPU(s), $((SECONDS - t0)) s"
