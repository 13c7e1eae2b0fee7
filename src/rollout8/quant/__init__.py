"""int8 checkpoints and their math: safetensors reader, quantized layouts, FlashRL's requantization
arithmetic, the streaming profiler, verify-quant, the vllm-ascend converter and the tiny test models.

Imports only the base modules (rollout8.errors, .fileutil, .paths, ...), never runspec/node/results/commands.
"""
