"""Golden files for vramfit's Llama-family decoder, from the reference
implementation (Hugging Face transformers): for each of three tiny
architectures, a checkpoint as `save_pretrained` writes it (config.json,
model.safetensors, f32) and `reference.json` with fixed tokens, their next
tokens, the reference's logits and its mean next-token loss. vramfit's
tests (crates/vramfit-models/tests/toolkit/llama.rs,
`the_reference_implementations_logits`) load each checkpoint as a user's
`--weights DIR` and compare.

- llama:   multi-head attention (4 query, 4 key/value heads), no biases,
           rope θ 10,000, RMSNorm ε 1e-6, separate head;
- mistral: grouped-query attention (4 query heads over 2 key/value heads),
           no biases, rope θ 1,000,000, ε 1e-5, separate head;
- qwen2:   grouped-query attention, q/k/v biases, head tied to the
           embedding, rope θ 1,000,000, ε 1e-6.

The weights are drawn with a fixed seed at a scale where the logits are
far from zero (σ 0.2; norms 1 + 0.1·N(0, 1)), so that a wrong convention
(rotary pairs, head order, gate order, tied head) moves them by far more
than the tolerance. Run by hand (it needs PyTorch and transformers from
the Python registry; not CI):

    python scripts/reference_llama.py [OUT_DIR]   (default crates/vramfit-models/tests/golden)

For each, a LoRA as PEFT makes it (rank 4, alpha 8: scale 2, on q, k, v
and o; its B drawn, not zero, so that both factors have gradients) is saved
with `save_pretrained` into `adapter/` (adapter_config.json,
adapter_model.safetensors), with the adapted model's logits and loss on the
same tokens and the gradient of that loss for every adapter factor, in
`adapter/reference.json`: vramfit reads the adapter back and compares.
The llama folder also holds `tokenizer.json`, a byte-pair tokenizer of 60
tokens trained on a fixed text (ids 1 and 2 are BOS and EOS, as in its
config.json; BOS first in every encoding): what vramfit tokenizes a text
corpus with in its tests.

The committed files were written with transformers 5.24 and PyTorch 2.15;
transformers 4.x writes another config.json layout (`rope_theta` at the
top, not in `rope_parameters`), which vramfit reads too.
"""

import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    hidden_act="silu",
)

ARCHITECTURES = {
    "llama": dict(model_type="llama", num_key_value_heads=4, rope_theta=10_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False),
    "mistral": dict(model_type="mistral", num_key_value_heads=2, rope_theta=1_000_000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, sliding_window=None),
    "qwen2": dict(model_type="qwen2", num_key_value_heads=2, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, use_sliding_window=False),
}

BATCH, TOKENS = 2, 9


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "crates", "vramfit-models", "tests", "golden")
    for seed, (name, arch) in enumerate(ARCHITECTURES.items()):
        torch.manual_seed(1000 + seed)
        kind = arch.pop("model_type")
        config = AutoConfig.for_model(kind, **SHAPE, **arch)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.2 * torch.randn_like(p))
        model.eval()
        seq = torch.randint(0, SHAPE["vocab_size"], (BATCH, TOKENS))
        tokens, targets = seq[:, :-1], seq[:, 1:]
        with torch.no_grad():
            logits = model(input_ids=tokens).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        folder = os.path.join(out, name)
        model.save_pretrained(folder, safe_serialization=True)
        # Only what vramfit reads: the weights and config.json.
        for extra in ("generation_config.json",):
            path = os.path.join(folder, extra)
            if os.path.exists(path):
                os.remove(path)
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(
                {
                    "architecture": name,
                    "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                    "scripts/reference_llama.py",
                    "tokens": tokens.tolist(),
                    "targets": targets.tolist(),
                    "logits": [[[round(v, 7) for v in row] for row in seq_] for seq_ in logits.tolist()],
                    "loss": loss.item(),
                },
                f,
            )
        print(f"{name}: loss {loss.item():.6f}, logits |max| {logits.abs().max().item():.3f} -> {folder}")
        lora(model, tokens, targets, os.path.join(folder, "adapter"), 2000 + seed)
    tokenizer(os.path.join(out, "llama", "tokenizer.json"))


RANK, ALPHA = 4, 8


def lora(model, tokens, targets, folder, seed):
    """The adapted model's logits, loss and adapter gradients, and the
    adapter as PEFT saves it."""
    import peft

    torch.manual_seed(seed)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    adapted = peft.get_peft_model(model, config)
    with torch.no_grad():
        for pname, p in adapted.named_parameters():
            if "lora_" in pname:
                p.copy_(0.2 * torch.randn_like(p))
    adapted.train()
    logits = adapted(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    grads = {}
    for pname, p in adapted.named_parameters():
        if "lora_" in pname:
            # PEFT's saved name: without the adapter's name ("default").
            grads[pname.replace(".default", "")] = {"shape": list(p.shape),
                                                     "values": [round(v, 9) for v in p.grad.flatten().tolist()]}
    adapted.save_pretrained(folder)
    # PEFT writes a model card beside the adapter: not what vramfit reads.
    os.remove(os.path.join(folder, "README.md"))
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(
            {
                "made_by": f"peft {peft.__version__}, transformers {transformers.__version__}, torch "
                f"{torch.__version__}, scripts/reference_llama.py",
                "logits": [[[round(v, 7) for v in row] for row in seq_] for seq_ in logits.tolist()],
                "loss": loss.item(),
                "gradients": grads,
            },
            f,
        )
    print(f"  adapter: loss {loss.item():.6f}, {len(grads)} factors -> {folder}")


TEXT = """the quick brown fox jumps over the lazy dog
a small model reads a small corpus
the dog sleeps and the fox runs away

every document ends where a blank line is
the fox and the dog are friends now
"""


def tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(TEXT.split("\n"), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(path)
    # Its ids for each document of a sample text (blank lines part them,
    # the line break before a blank line is not the document's), as
    # vramfit's corpus reader must give them (then EOS, id 2, after each).
    documents = [d.strip("\n") for d in SAMPLE.split("\n\n") if d.strip()]
    ids = [tok.encode(d).ids for d in documents]
    with open(os.path.join(os.path.dirname(path), "tokenized.json"), "w") as f:
        json.dump({"made_by": "tokenizers (Python) " + __import__("tokenizers").__version__, "text": SAMPLE,
                   "documents": ids}, f)
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {path}")


SAMPLE = """the lazy fox reads
a quick dog runs over the brown corpus

and where the line is blank, a new document
starts: zebra!
"""


if __name__ == "__main__":
    main()
