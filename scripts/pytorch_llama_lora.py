"""The LoRA step vramfit trains (`vramfit train llm --shape tinyllama-1.1b
--train lora:8`), in PyTorch with Hugging Face transformers and PEFT, for a
speed and resident-set comparison on the CPU: TinyLlama-1.1B's shape
(width 2048, 22 blocks, 32 heads, 4 key/value heads, MLP 5632, vocabulary
32,000) drawn at random (nothing downloaded: this measures speed, not
learning), rank-8 adapters on q, k, v and o (alpha 16), the rest frozen,
AdamW on the adapters. `--dtype bf16` loads the model in bf16 (PEFT keeps
its adapters in f32, its default). Prints one JSON line: the median ms per
step after one warm-up step, every step's time, tokens per second, the
parameter counts and the process's peak resident set."""

import argparse
import json
import resource
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    config = LlamaConfig(
        vocab_size=32_000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rope_theta=10_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.set_default_dtype(dtype)
    model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    lora = LoraConfig(
        r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    model = get_peft_model(model, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    times = []
    for _ in range(a.steps + 1):
        tokens = torch.randint(0, config.vocab_size, (a.batch, a.tokens))
        start = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - start) * 1000.0)
    steps = times[1:]
    median = statistics.median(steps)
    print(
        json.dumps(
            {
                "implementation": f"PyTorch {torch.__version__} + PEFT, {a.dtype}",
                "dtype": a.dtype,
                "tokens": a.tokens,
                "batch": a.batch,
                "rank": a.rank,
                "threads": a.threads,
                "median_step_ms": median,
                "step_ms": steps,
                "tokens_per_second": a.batch * a.tokens / (median / 1000.0),
                "parameters": total,
                "trainable_parameters": trainable,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            }
        )
    )


if __name__ == "__main__":
    main()
