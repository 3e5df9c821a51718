#!/bin/sh
# A test fixture: vLLM for the CPU (this checkout's .venv) started where an experiment says `device: gpu`, so that
# a GPU config's jobs go through SLURM as a GPU user's do (--gpus=h100:1 granted by the CI node's GPUs, declared as
# a generic resource without devices) while its server runs on the CPU. It is a runtime.command of the test's
# experiment; speedmatrix's check before the run cannot look inside a script and says so (not checked).
exec "$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python" -m vllm.entrypoints.openai.api_server "$@"
