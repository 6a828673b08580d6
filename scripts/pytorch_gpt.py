"""The transformer vramfit trains (`vramfit train transformer`), in PyTorch,
for a speed comparison on the CPU: token and learned position embeddings,
pre-norm blocks (LayerNorm, causal multi-head attention with one fused QKV
projection, GELU MLP of 4x width), a final norm and a head tied to the
token embedding; AdamW; f32. `--sdpa` computes attention with
torch's fused scaled_dot_product_attention (causal) instead of the explicit
scores, mask and softmax. Random tokens: this measures speed, not
learning. Prints one JSON line: median ms per step after warm-up, tokens
per second, parameter count and the process's peak resident set; with
`--device cuda`, also the caching allocator's peak reserved and allocated
bytes (reserved is the figure that decides an out-of-memory there)."""

import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp_in = nn.Linear(width, 4 * width)
        self.mlp_out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, h, w // h).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(2, 3)) / math.sqrt(w // h)
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
            mixed = scores.masked_fill(mask, float("-inf")).softmax(dim=3) @ v
        x = x + self.proj(mixed.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, width, depth, heads, context, sdpa=False):
        super().__init__()
        self.token = nn.Parameter(torch.randn(vocab, width) * 0.02)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, sdpa) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, tokens):
        x = self.token[tokens] + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.token.t()


def train(a, model, opt, times, cuda):
    for _ in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.tokens + 1)).to(a.device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        # --amp: autocast's matrix work (and so SDPA's flash kernel) in that
        # type, f32 master weights, as vramfit's --precision.
        with torch.autocast(a.device.split(":")[0], dtype=getattr(torch, a.amp or "float32"), enabled=bool(a.amp)):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sdpa", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", choices=["bfloat16", "float16"], help="autocast to this type")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = Gpt(a.vocab, a.width, a.depth, a.heads, a.tokens, a.sdpa).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    times = []
    try:
        train(a, model, opt, times, cuda)
    except torch.OutOfMemoryError as e:
        print(json.dumps({"torch": torch.__version__, "device": a.device, "tokens": a.tokens,
                          "attention": "scaled_dot_product_attention" if a.sdpa else "explicit",
                          "error": "out of memory: " + str(e).split(".")[0]}))
        return
    ms = statistics.median(times[3:]) * 1000
    record = {
        "torch": torch.__version__,
        "device": a.device,
        "tokens": a.tokens,
        "threads": a.threads,
        "attention": "scaled_dot_product_attention" if a.sdpa else "explicit",
        "amp": a.amp or "none",
        "median_step_ms": ms,
        "tokens_per_second": a.batch * a.tokens / (ms / 1000),
        "parameters": sum(p.numel() for p in model.parameters()),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if cuda:
        record["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        record["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(record))


if __name__ == "__main__":
    main()
