"""The two Python halves of scripts/peft-round-trip.sh (run by hand, not CI).

    peft_round_trip.py base OUT      a Llama checkpoint as transformers writes
                                     it (OUT/base: config.json,
                                     model.safetensors, tokenizer.json: a
                                     byte-pair tokenizer trained on
                                     OUT/corpus.txt) to fine-tune
    peft_round_trip.py peft OUT      PEFT loads OUT/run's adapters onto
                                     OUT/base; its logits (and the base's) on
                                     held-out text into OUT/peft.json, with
                                     how far OUT/merged (vramfit export) is
                                     from PEFT's merge_and_unload
"""

import json
import os
import sys

import torch

SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
             rope_theta=10_000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
HELD_OUT = "the planner picks the fastest plan that fits the budget and says why"


def base(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = os.path.join(out, "base")
    text = open(os.path.join(out, "corpus.txt"), encoding="utf-8").read()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=SHAPE["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(text.split("\n"), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE), dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    print(f"base: {sum(p.numel() for p in model.parameters())} parameters, tokenizer {tok.get_vocab_size()} "
          f"tokens -> {folder}")


def peft_logits(out):
    import peft
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    folder = os.path.join(out, "base")
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    ids = tok.encode(HELD_OUT).ids
    tokens = torch.tensor([ids])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = model(input_ids=tokens).logits
    adapted = peft.PeftModel.from_pretrained(model, os.path.join(out, "run")).eval()
    with torch.no_grad():
        logits = adapted(input_ids=tokens).logits
        # vramfit's merged export (vramfit export) against PEFT's own merge.
        exported = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"), dtype=torch.float32).eval()
        merged = adapted.merge_and_unload()
        export_gap = (exported(input_ids=tokens).logits - merged(input_ids=tokens).logits).abs().max().item()
    with open(os.path.join(out, "peft.json"), "w") as f:
        json.dump({"made_by": f"peft {peft.__version__}, transformers {transformers.__version__}, "
                   f"torch {torch.__version__}",
                   "tokens": tokens.tolist(), "logits": logits.tolist(), "base_logits": base_logits.tolist(),
                   "export_against_merge_and_unload": export_gap}, f)
    print(f"peft: {logits.numel()} logits; the adapters moved them by up to "
          f"{(logits - base_logits).abs().max().item():.4f}; vramfit's merged export against PEFT's "
          f"merge_and_unload: logits within {export_gap:.3e}")


if __name__ == "__main__":
    {"base": base, "peft": peft_logits}[sys.argv[1]](sys.argv[2])
