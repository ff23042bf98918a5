#!/usr/bin/env bash
# On the offline GPU machine, in the repository root, with .kit/ from tools/offline-gpu/kit.sh:
#   tools/offline-gpu/train.sh OUT_ARCHIVE SECONDS -- python3 -m reproduce table3 --row B \
#       --scale cpu --seeds 0 1 2 --workers 8
# installs the kit's pinned packages (.kit/requirements.txt) from its wheels, points the data at the carried Bible extract
# and tokenizers, runs the command (W&B offline) for at most SECONDS (then interrupts it), and
# packs what it wrote under results/ (records, outputs, tables) with its log into OUT_ARCHIVE
# (.tar.gz), also when it failed or was stopped part way. Unpack the archive in the repository
# root here; the same command resumes whatever did not finish (runs left part way resume from
# their checkpoints on a machine still warm, else restart).
set -uo pipefail
out=$1; seconds=$2; shift 2; [ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/../.."
# the kit's packages and the Bible extract (PYTHON: the interpreter, default python3)
bash tools/offline-gpu/install.sh || exit $?
export REPRODUCE_BIBLE_DB=$PWD/.kit/bible.db REPRODUCE_CACHE=$PWD/.kit/cache WANDB_MODE=offline \
       HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# The records name the commit the kit was built at: the copy may have no .git, or one that lags
# (the lent machines' copy named an older HEAD, "dirty"). Rebuild the kit, or only its commit
# (kit.sh --commit), after each commit.
export REPRODUCE_COMMIT="$(cat .kit/commit)"
# A second call on a machine still warm gets the working tree copied again: records the last call
# wrote under results/ are gone, while the ignored runs/ (checkpoints) stays. Keep a copy of each
# call's records there and put back those missing, so finished runs are not evaluated again.
keep=${REPRODUCE_RUNS:-runs}/offline-gpu
[ -d "$keep/results" ] && cp -rnp "$keep/results/." results/ \
    && echo "train.sh: $(find "$keep/results" -name '*.json' | wc -l) record file(s) kept from an earlier call"
# what was put back keeps its times (-p), older than this mark: it is not packed twice
touch .kit/started
timeout --signal=INT --kill-after=60 "$seconds" "$@" 2>&1 | tee .kit/train.log
status=${PIPESTATUS[0]}
new=$(find results -newer .kit/started -type f \( -name '*.json' -o -name '*.gz' -o -name '*.md' \
      -o -name '*.png' \))
tar -czf "$out" .kit/train.log $new
[ -n "$new" ] && mkdir -p "$keep" && tar -cf - $new | tar -xpf - -C "$keep"
echo "train.sh: exit $status; $(echo "$new" | grep -c '\.json$') record file(s) -> $out"
exit "$status"
