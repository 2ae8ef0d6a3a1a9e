"""Checks a `forge export --format hf` of a Llama or Qwen2 in plain PyTorch (no transformers).

  /usr/bin/python3 tests/golden/check_llama_export.py DIR FORGE_OUTPUTS

DIR is the exported directory (config.json, model.safetensors in F32, BF16 or F16). FORGE_OUTPUTS
holds two lines in the golden format ("name count values..."): `ids` (one row of token ids) and
`logits` (Forge's, [len(ids), vocab_size] row-major), written by tests/formats/
test_hf_llama_export.cpp. The forward is make_llama_goldens.py's, which follows transformers'
LlamaForCausalLM and Qwen2ForCausalLM as the config describes them (RMSNorm, rotate-half RoPE with
rope_theta and rope_scaling none/linear/llama3, grouped-query attention, SwiGLU, q/k/v biases
where the weights have them, tied or separate head), in float64. Exits 0 when the logits agree
within 1e-4, printing the largest gap.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_goldens import read_safetensors  # noqa: E402  (the standard-library reader)
from make_llama_goldens import logits  # noqa: E402  (LlamaForCausalLM's forward, in float64)

dt = torch.float64


def main(directory, outputs):
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] in ("llama", "qwen2"), cfg["model_type"]
    w = read_safetensors(os.path.join(directory, "model.safetensors"))
    forge = {}
    with open(outputs) as f:
        for line in f:
            name, _, *values = line.split()
            forge[name] = torch.tensor([float(v) for v in values], dtype=dt)
    got = logits(w, cfg, forge["ids"].long()[None, :])
    worst = (got.reshape(-1) - forge["logits"]).abs().max().item()
    print(f"{directory}: {cfg['model_type']}, max |PyTorch - Forge| logits {worst:.3g}")
    sys.exit(0 if worst <= 1e-4 else 1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
