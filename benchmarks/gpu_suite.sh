#!/usr/bin/env bash
# The GPU benchmarks, most important first, inside one time budget (a lent GPU is held for minutes, not hours):
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [BUDGET_SECONDS]
#
# 1. accelerator.py on the MNIST MLP: engine vs per-client JAX loop vs per-client PyTorch loop, cohorts 10, 100
#    and 1000, and the 8-seed sweep as one program vs 8 runs;
# 2. the same on the CIFAR-10 simple-CNN;
# 3. fedcog_cost.py: FedCOG's generation against one round of local training (the paper's Table 11 is on a GPU);
# 4. accelerator.py on the CIFAR-10 ResNet-18, cohorts 10 and 100;
# 5. ResNet-18's working memory per client with its residual blocks stored and rematerialised.
#
# Each step gets at most what is left of the budget and is cut off when it runs out; accelerator.py merges the
# rows of every step into one JSON in OUT_DIR, so a step cut off loses only its own rows. Data come from
# $FEDJAX_LAB_DATA (default ../shared/data). Timings are per call of compiled programs, not of this script.
set -u -o pipefail
out=${1:?usage: gpu_suite.sh OUT_DIR [BUDGET_SECONDS]}
budget=${2:-480}
mkdir -p "$out"
start=$SECONDS
cd "$(dirname "$0")/.."

step() {  # step MAX_SECONDS COMMAND...: runs COMMAND for at most MAX_SECONDS and what is left of the budget
    local max=$1 left=$((budget - (SECONDS - start)))
    shift
    if ((left < 30)); then echo "== skipped, budget spent: $*"; return; fi
    ((max > left)) && max=$left
    echo "== [$((SECONDS - start)) s] $* (at most $max s)"
    timeout -k 5 "$max" "$@"
    echo "== rc $? [$((SECONDS - start)) s]"
    pkill -f "accelerator.py --worker" 2>/dev/null || true  # a worker outliving a step cut off
}

python -c "import jax, flax, optax, torch, fedjax_lab.experiments.build as b
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__)
print(jax.devices(), 'lowering', b.default_lowering(jax.default_backend()))" || exit 3
# A whole run of the engine (jit, scan, checkpoint), so that a broken install stops the suite in seconds.
python -m fedjax_lab.experiments.cli run configs/synthetic_fedavg.yaml rounds.num_rounds=3 --run-dir \
    "$(mktemp -d)" 2>&1 | tail -2 || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
# Decode the CIFAR-10 archive into the cache while the MLP steps run, so that no timed worker pays for it.
python -c "from fedjax_lab.data.sources import load_local; load_local('cifar10')" &

bench=(python benchmarks/accelerator.py --reps 2 --min-time 1 --timeout 60 --out "$out")
step 200 "${bench[@]}" --models mlp --cohorts 10 100 1000 --sweep-seeds 8
wait
step 150 "${bench[@]}" --models simple_cnn --cohorts 10 100 1000
step 90 python benchmarks/fedcog_cost.py --out "$out/fedcog_cost_gpu.json"
step 600 "${bench[@]}" --models resnet18 --cohorts 10 100 --timeout 90
step 120 python benchmarks/scale_memory.py --only remat --out "$out"  # ResNet-18 per client, blocks stored or not
echo "== done [$((SECONDS - start)) s]"
