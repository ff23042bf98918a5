#!/usr/bin/env bash
# On the offline GPU machine, in the repository root, with .kit/ from tools/offline-gpu/kit.sh:
# install the kit's pinned packages (.kit/requirements.txt) from its wheels where this Python lacks
# them or has others, check that the project imports, and unpack the carried Bible extract.
# Used by train.sh and by benchmarks/gpu_window.py (which runs it beside the first GPU parts).
# PYTHON: the interpreter to install into (default python3: on the lent machines, the one with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
if ! "$py" -m pip install -q --no-index --find-links .kit/whl -r .kit/requirements.txt; then
    # Most often a package of the image older than one of ours requires (pyarrow for datasets):
    # install the carried wheels as they are and let the import check below decide.
    echo "install.sh: pinned install failed ($("$py" -m pip show pyarrow 2>/dev/null | grep ^Version));" \
         "installing the carried wheels without their requirements"
    "$py" -m pip install -q --no-index --no-deps .kit/whl/*.whl || true
fi
"$py" -c "import datasets, nltk, optuna, sacrebleu, sentencepiece, wandb, reproduce" \
    || { echo "install.sh: the carried wheels do not install here"; exit 3; }
[ -f .kit/bible.db ] || gunzip -k .kit/bible.db.gz
