#!/usr/bin/env bash
# GPU checks on a machine with NVIDIA GPUs (issue 26): starts its own local master and agent from this
# checkout (`det deploy local up`, a throwaway state directory and port) and checks
#   1. the agent finds the GPUs, as slots of type cuda, one per GPU nvidia-smi lists;
#   2. a trial sees exactly its CUDA_VISIBLE_DEVICES (one GPU of the agent's, by uuid; torch sees one);
#   3. torch.cuda works in the process runtime;
#   4. torch.cuda works in a Docker container given the allocation's GPU by a device request
#      (`--runtime docker`; needs Docker and NVIDIA's container toolkit);
#   5. a 2-process job (slots_per_trial 2, harness.launch.torch_distributed) trains with NCCL
#      (skipped, with a line saying so, where there is only one GPU).
# One PASS/FAIL/SKIP line per check; exit 0 when none failed, 1 otherwise, 2 when there is no GPU.
#
#   tests/gpu/check.sh
#   PYTHON=/path/to/python  interpreter with Shipyard (this checkout) and torch with CUDA
#                           (default: the checkout's .venv/bin/python, else python3); run as root, the
#                           agent runs trials as other uids, so it must be where they can run it
#                           (not under a 0700 /root)
#   GPU_ENV_IMAGE=IMAGE     the image of check 4 (default: the clouds' default GPU image)
#   GPU_CHECK_TIMEOUT_S=N   how long each trial may take (default 600: the first pull of the image)
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "NO GPU: nvidia-smi is not on PATH (no NVIDIA driver here); the GPU checks need an NVIDIA GPU"
    exit 2
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
    echo "NO GPU: nvidia-smi lists no NVIDIA GPU here; the GPU checks need one"
    exit 2
fi
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=$(command -v python3)
cd "$repo" && exec "$python" "$repo/tests/gpu/check.py" "$@"
