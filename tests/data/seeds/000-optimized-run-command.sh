docker run --gpus '"device=0,1"' \
           --name gemma4-31b-it \
           --ipc=host \
           -p 8000:8000 \
           -v ~/.cache/huggingface:/root/.cache/huggingface \
           -e CUDA_DEVICE_ORDER=PCI_BUS_ID \
           -e CUDA_VISIBLE_DEVICES=0,1 \
           -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
           -e VLLM_NVFP4_GEMM_BACKEND=cutlass \
           -e SAFETENSORS_FAST_GPU=1 \
           -e OMP_NUM_THREADS=12 \
           vllm/vllm-openai:cu129-nightly \
    nvidia/Gemma-4-31B-IT-NVFP4 \
    --quantization modelopt_fp4 \
    --tensor-parallel-size 2 \
    --gpu-memory-utilization 0.9 \
    --max-model-len 175000 \
    --max-num-seqs 32 \
    --enable-chunked-prefill \
    --enable-prefix-caching \
    --kv-cache-dtype auto \
    --tool-call-parser gemma4 \
    --reasoning-parser gemma4 \
    --enable-auto-tool-choice \
    --disable-custom-all-reduce \
    --speculative-config '{"model": "google/gemma-4-31B-it-assistant", "num_speculative_tokens": 4}' \
    --host 0.0.0.0 \
    --port 8000
