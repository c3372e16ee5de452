#!/usr/bin/env bash
# Reproduction runs on a lent GPU inside one time budget: several copies of the table scripts share the runs
# (their claim files), and the records of the runs that finished come back as one archive.
#
#   bash benchmarks/gpu_tables.sh OUT_DIR BUDGET_SECONDS "N:COMMAND" ["N:COMMAND" ...]
#
# Each "N:COMMAND" starts N copies of COMMAND (a table script, e.g. "6:python benchmarks/feddle_table.py
# --datasets cifar10 ..."). At the budget every copy is stopped; a run cut off leaves no record. The record files
# that runs finished meanwhile were added to (``benchmarks/results/records/<table>.jsonl.gz``, as the scripts keep
# them) are packed into OUT_DIR/records.tgz and the copies' logs into OUT_DIR/logs.tgz (two files: a lent
# machine sends back at most 8; the logs' archive also holds the metrics.jsonl of every run that wrote, so a run
# cut off says how far it came). Unpack the records in a folder of their own and merge them,
# ``python benchmarks/compact_records.py --merge DIR/benchmarks/results/records/*.jsonl.gz``. The runs cut off
# come back in OUT_DIR/unfinished.tgz where it is under 16 MB, to resume here or in a later loan. The
# GPU is shared by the copies (no preallocation), the CPU cores too: each run is small, so several at once fill the
# GPU better than one. Data come from $FEDJAX_LAB_DATA. Records made here say "backend": "gpu".
set -u -o pipefail
out=${1:?usage: gpu_tables.sh OUT_DIR BUDGET_SECONDS N:COMMAND...}
budget=${2:?budget in seconds}
shift 2
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the table scripts import fedjax_lab from the checkout
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
marker=$(mktemp)
kept() {  # how many runs the record files hold
    python -c 'import glob, sys; sys.path.insert(0, "benchmarks"); import records
print(sum(len(records.read(p)) for p in glob.glob("benchmarks/results/records/*.jsonl.gz")))'
}
before=$(kept)
pids=()
k=0
for spec in "$@"; do
    for ((i = 0; i < ${spec%%:*}; i++)); do
        k=$((k + 1))
        setsid bash -c "${spec#*:} --out /tmp/report_$k.md" >"$out/worker_$k.log" 2>&1 &
        pids+=($!)
        sleep 2  # the copies claim their first runs one after another
    done
done
echo "== $k copies started"
end=$((SECONDS + budget))
while ((SECONDS < end)); do
    sleep 5
    running=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
    ((running == 0)) && break
done
for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null; done
# A run stopped by SIGTERM finishes its block and writes its results; give it 30 s, then stop it outright.
for _ in $(seq 30); do
    running=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
    ((running == 0)) && break
    sleep 1
done
for p in "${pids[@]}"; do kill -9 -- -"$p" 2>/dev/null; done
find benchmarks/results/records -name "*.jsonl.gz" -newer "$marker" -print0 | tar czf "$out/records.tgz" --null -T -
echo "== $(($(kept) - before)) runs finished in $SECONDS s"
grep -h "test acc" "$out"/worker_*.log
# The logs, and the metrics of every run that wrote this time: how far a run cut off by the budget came.
mapfile -t metrics < <(find runs -name metrics.jsonl -newer "$marker" 2>/dev/null)
tar czf "$out/logs.tgz" -C "$out" $(cd "$out" && ls worker_*.log) -C "$PWD" "${metrics[@]}" \
    && rm -f "$out"/worker_*.log
# The runs the budget cut off, claims left out, where they fit what comes back (16 MiB a file): unpacked into
# the repository, the same table command resumes each from its last checkpoint, here or in a later loan.
mapfile -t unfinished < <(for m in "${metrics[@]}"; do [[ -f ${m%/*}/summary.json ]] || echo "${m%/*}"; done)
if ((${#unfinished[@]})); then
    tar czf "$out/unfinished.tgz" "${unfinished[@]}"
    if (($(stat -c %s "$out/unfinished.tgz") > 16000000)); then
        rm "$out/unfinished.tgz"
        echo "== ${#unfinished[@]} unfinished runs, too large to send back"
    else
        echo "== ${#unfinished[@]} unfinished runs in unfinished.tgz: tar xzf it in the repository's root"
    fi
fi
