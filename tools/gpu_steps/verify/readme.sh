#!/usr/bin/env bash
# README's blocks for GPU machines as written (the GPU install, then gpucheck run --all-devices; the sdist), each in a fresh venv of a fresh copy
# Each `<!-- readme: gpu -->` block of README.md that runs on its own (tools/readme_blocks.py
# gpu: the main job, whose first lines are the Install block for GPUs; the sdist's install)
# runs with `bash -ex` as written, in a fresh copy of the checkout (its tracked files) and a
# fresh venv that sees this machine's CUDA torch (tools/fresh_venv.py: --system-site-packages,
# and the packages of the venv python3 runs in, gpucheck's own left out), as README tells a
# GPU user to keep theirs. Without network pip installs from carried wheels: README_WHEELS
# (default .whl/, e.g. plyfile, setuptools and wheel for the isolated build) through
# PIP_NO_INDEX=1 PIP_FIND_LINKS in the environment, never by changing the commands. After a
# block: torch is still the machine's, gpucheck is the venv's (imported from another folder),
# and a block that ran no `gpucheck` gets `gpucheck devices` and its kernels' import. Kernels
# built on first use go to a fresh cache ($S/lineN/cache). Settings: README_WHEELS,
# README_LINES (the blocks' first lines, default every one: `python3 tools/readme_blocks.py gpu`).
WHEELS_DIR=$(cd "${README_WHEELS:-$ROOT/.whl}" 2>/dev/null && pwd) || WHEELS_DIR=
export PIP_NO_INDEX=1 PIP_FIND_LINKS=${WHEELS_DIR:-/nonexistent} PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH  # tools/gpu's WHEELS: the venv must install what the block installs itself
echo "carried wheels: $(ls "$WHEELS_DIR" 2>/dev/null | tr '\n' ' ')"
lines=${README_LINES:-$("$PY" tools/readme_blocks.py gpu | cut -f1)}
torch_before=$("$PY" -c "import torch; print(torch.__version__)")
copy() {  # the checkout as a fresh clone has it
  mkdir -p "$1"
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
      | (cd "$ROOT" && xargs -0 cp --parents -t "$1" 2>/dev/null)
  else  # a copy of the tree without git: what git would ignore left out
    tar -C "$ROOT" --exclude=./build --exclude=./.whl --exclude=./.gl --exclude=./.nox \
      --exclude=./dist --exclude=./.venv --exclude='*.so' --exclude=__pycache__ \
      --exclude='*.egg-info' -cf - . | tar -C "$1" -xf -
  fi
}
failed=0
bad() { echo "UNEXPECTED: $1"; [ "$rc" -ne 0 ] || rc=1; }
for line in $lines; do
  D=$S/line$line
  copy "$D/clone"
  "$PY" tools/readme_blocks.py gpu "$line" >"$D/block.sh" || { failed=1; continue; }
  "$PY" tools/fresh_venv.py "$D/venv"
  echo "--- README.md:$line, as written:"; cat "$D/block.sh"
  t0=$SECONDS
  (cd "$D/clone" && PATH=$D/venv/bin:$PATH VIRTUAL_ENV=$D/venv GPUCHECK_CACHE_DIR=$D/cache \
    bash -ex "$D/block.sh") >"$D/block.log" 2>&1
  rc=$?
  tail -4 "$D/block.log"
  torch_after=$(cd / && "$D/venv/bin/python" -c "import torch; print(torch.__version__, torch.cuda.is_available())")
  where=$(cd / && "$D/venv/bin/python" -c "import gpucheck; print(gpucheck.__file__)" 2>&1)
  version=$(cd / && PATH=$D/venv/bin:$PATH gpucheck --version 2>&1)
  echo "torch before: $torch_before; after: $torch_after; gpucheck at $where; $version"
  if ! grep -q "^+ gpucheck " "$D/block.log"; then  # an install alone: the GPU and kernels
    (cd / && PATH=$D/venv/bin:$PATH gpucheck devices && "$D/venv/bin/python" -c \
      "import torch, gpucheck._C as c; print('kernels built at install:', c.__file__)") 2>&1 | tail -3
  fi
  for run in "$D"/clone/reports/*/results.jsonl; do [ -f "$run" ] && tables counts "${run%/*}"; done
  case $where in "$D/venv/"*) ;; *) bad "gpucheck is not the venv's" ;; esac
  [ "${torch_after%% *}" = "$torch_before" ] || bad "torch was replaced"
  note "readme: README.md:$line rc=$rc in $((SECONDS - t0)) s; $(grep -E '^(passed|failed|warnings|incomplete|nothing-tested|interrupted) \(exit' "$D/block.log" | tail -1)"
  [ "$rc" -eq 0 ] || failed=1
done
exit "$failed"
