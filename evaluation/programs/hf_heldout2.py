"""Hugging Face programs of the field, the SECOND HELD-OUT set: architectures and code neither ``hf.py`` nor
``hf_heldout.py`` has — GPT-NeoX (parallel residual, partial rotary), OPT (learned positions, fp16 + GradScaler),
Phi-3 (fused qkv and gate-up projections), Gemma (a 256k vocabulary, one key/value head, LoRA on every linear
layer), BLOOM (ALiBi), ViT image classification, BART beam search in fp16, sampling with a repetition penalty,
packed sequences with per-document positions, and ``accelerate`` with gradient accumulation over four
micro-batches.

Written after the predictor's rules were settled on the first two sets (commit 2949d24's predictor, which had
seen both), and predicted blind before any of its recordings was read (``docs/predict-blind-hf-heldout2.txt``).
HELD OUT: never use these programs or their recordings to tune, fit or debug a predictor.

Each program is a plain function a user's script would be: a model from a config with random weights (no hub
download), random token ids, masks and labels (or images and class labels) as a collator would make them, a few
training steps (or one ``generate()`` call) with the loss logged. Keyword arguments: ``batch``, sequence lengths
in tokens, ``size`` (``"tiny"`` exists only for the CPU check), options, and ``device``. ``RUNS`` and ``CHAINS``
are the H200 recording plan (``evaluation/record_programs.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EXP = "expandable_segments:True"

NEOX_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 1000},
    "410m": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
             "vocab_size": 50304},  # pythia-410m
}
OPT_SIZES = {
    "tiny": {"hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "word_embed_proj_dim": 64, "vocab_size": 1000},
    "350m-12l": {"hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 12, "num_attention_heads": 16,
                 "word_embed_proj_dim": 1024, "vocab_size": 50272},
}
PHI3_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 1000},
    "mini-8l": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 8, "num_attention_heads": 32,
                "num_key_value_heads": 32, "vocab_size": 32064},  # phi-3-mini widths, 8 of its 32 layers
}
GEMMA_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 1000},
    "2b-6l": {"hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 6, "num_attention_heads": 8,
              "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000},  # gemma-2b widths, 6 of 18 layers
}
BLOOM_SIZES = {
    "tiny": {"hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000},
    "560m": {"hidden_size": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 250880},
}
VIT_SIZES = {
    "tiny": {"image_size": 32, "patch_size": 8, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128},
    "base": {"image_size": 224, "patch_size": 16, "hidden_size": 768, "num_hidden_layers": 12,
             "num_attention_heads": 12, "intermediate_size": 3072},
}
BART_SIZES = {
    "tiny": {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
             "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 1000},
    "base": {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
             "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 50265},
}
QWEN2_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1000},
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936},
}
MISTRAL_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1000},
    "350m": {"hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 16, "num_attention_heads": 16,
             "num_key_value_heads": 4, "vocab_size": 32000},
}


def _causal_lm(model_type: str, sizes: dict, size: str, device: str, dtype: torch.dtype = torch.float32,
               **extra) -> tuple:
    """A causal LM of ``model_type`` from a config with random weights, built on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **sizes[size], **extra)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return config, model


def neox_finetune(batch: int, seq: int = 512, size: str = "410m", attn: str = "sdpa", steps: int = 3,
                  device: str = "cuda") -> None:
    """A Pythia-style GPT-NeoX (parallel residual, rotary on a quarter of each head) fine-tuned in fp32 weights
    under bf16 autocast, AdamW with a linear warm-up."""
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(1)
    config, model = _causal_lm("gpt_neox", NEOX_SIZES, size, device, attn_implementation=attn)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    scheduler = get_linear_schedule_with_warmup(optimizer, 1, steps)
    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: {loss.item():.3f}")


def opt_fp16_finetune(batch: int, seq: int = 512, size: str = "350m-12l", steps: int = 3,
                      device: str = "cuda") -> None:
    """OPT (learned positions, ReLU MLP) in fp32 weights under fp16 autocast with a GradScaler, right-padded rows
    of random lengths, the padding ignored in the loss."""
    torch.manual_seed(2)
    config, model = _causal_lm("opt", OPT_SIZES, size, device, pad_token_id=1)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    for step in range(steps):
        lengths = torch.randint(seq // 2, seq + 1, (batch,))
        lengths[0] = seq
        attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        input_ids = torch.randint(3, config.vocab_size, (batch, seq)).masked_fill(attention_mask == 0, 1)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
            loss = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                         labels=labels.to(device)).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {loss.item():.3f} scale {scaler.get_scale()}")


def phi3_ckpt_finetune(batch: int, seq: int = 1024, size: str = "mini-8l", steps: int = 2,
                       device: str = "cuda") -> None:
    """Phi-3-mini widths (fused qkv and gate-up projections), bf16 weights and AdamW states, gradient
    checkpointing."""
    torch.manual_seed(3)
    config, model = _causal_lm("phi3", PHI3_SIZES, size, device, dtype=torch.bfloat16, pad_token_id=0)
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    for step in range(steps):
        input_ids = torch.randint(1, config.vocab_size, (batch, seq), device=device)
        loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {loss.item():.3f}")


def gemma_lora(batch: int, seq: int = 512, size: str = "2b-6l", steps: int = 3, device: str = "cuda") -> None:
    """LoRA (rank 8, every linear layer, dropout 0.05) over a frozen bf16 Gemma-style base: one key/value head of
    256, a 256k vocabulary; the adapters in fp32 under bf16 autocast."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(4)
    config, model = _causal_lm("gemma", GEMMA_SIZES, size, device, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    model.print_trainable_parameters()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {loss.item():.3f}")


def bloom_finetune(batch: int, seq: int = 256, size: str = "560m", steps: int = 3, device: str = "cuda") -> None:
    """BLOOM (ALiBi positions, a 250k vocabulary) fine-tuned in fp32 with AdamW and an attention mask over
    left-padded rows."""
    torch.manual_seed(5)
    config, model = _causal_lm("bloom", BLOOM_SIZES, size, device, pad_token_id=3)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(steps):
        starts = torch.randint(0, seq // 4, (batch,))
        starts[0] = 0
        attention_mask = (torch.arange(seq)[None, :] >= starts[:, None]).long()
        input_ids = torch.randint(5, config.vocab_size, (batch, seq)).masked_fill(attention_mask == 0, 3)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                    labels=labels.to(device))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {out.loss.item():.3f}")


def vit_classify(batch: int, size: str = "base", labels: int = 100, steps: int = 3, device: str = "cuda") -> None:
    """``ViTForImageClassification`` from a ``ViTConfig`` trained on random images under bf16 autocast, AdamW and
    label smoothing computed outside the model."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(6)
    config = ViTConfig(**VIT_SIZES[size], num_labels=labels)
    model = ViTForImageClassification(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
    for step in range(steps):
        pixels = torch.randn(batch, 3, config.image_size, config.image_size, device=device)
        target = torch.randint(0, labels, (batch,), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(pixel_values=pixels).logits
        loss = torch.nn.functional.cross_entropy(logits.float(), target, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {loss.item():.3f}")


def bart_beam_generate(batch: int, src_len: int = 256, new_tokens: int = 48, size: str = "base",
                       device: str = "cuda") -> None:
    """Summarisation-style ``generate()`` from an fp16 BART (built on the GPU): 3 beams over right-padded source
    documents of random lengths."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(7)
    config = BartConfig(**BART_SIZES[size], pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2, forced_eos_token_id=2)
    with torch.device(device):
        model = BartForConditionalGeneration(config).to(torch.float16 if device == "cuda" else torch.float32)
    model.eval()
    lengths = torch.randint(src_len // 2, src_len + 1, (batch,))
    lengths[0] = src_len
    attention_mask = (torch.arange(src_len)[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(4, config.vocab_size, (batch, src_len)).masked_fill(attention_mask == 0, 1)
    out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), num_beams=3,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, early_stopping=True)
    print(f"generated {tuple(out.shape)}")


def neox_sample_generate(batch: int, prompt_len: int = 128, new_tokens: int = 64, size: str = "410m",
                         device: str = "cuda") -> None:
    """Sampling from a bf16 GPT-NeoX (built on the GPU): top-k 50, temperature 0.8, repetition penalty 1.2,
    left-padded prompts of random lengths, the dynamic cache."""
    torch.manual_seed(8)
    config, model = _causal_lm("gpt_neox", NEOX_SIZES, size, device,
                               dtype=torch.bfloat16 if device == "cuda" else torch.float32, pad_token_id=0)
    model.eval()
    lengths = torch.randint(prompt_len // 2, prompt_len + 1, (batch,))
    lengths[0] = prompt_len
    attention_mask = (torch.arange(prompt_len)[None, :] >= (prompt_len - lengths)[:, None]).long()
    input_ids = torch.randint(1, config.vocab_size, (batch, prompt_len)).masked_fill(attention_mask == 0, 0)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), do_sample=True,
                             top_k=50, temperature=0.8, repetition_penalty=1.2, max_new_tokens=new_tokens,
                             pad_token_id=0)
    print(f"generated {tuple(out.shape)}")


def packed_sft(batch: int, seq: int = 1024, size: str = "0.5b", steps: int = 3, device: str = "cuda") -> None:
    """SFT on packed rows: documents of random lengths concatenated into each row, ``position_ids`` restarting at
    every document (transformers then keeps attention within documents), the first token of each document not a
    target; Qwen2-0.5B widths in fp32 under bf16 autocast, AdamW with ``OneCycleLR``."""
    torch.manual_seed(9)
    config, model = _causal_lm("qwen2", QWEN2_SIZES, size, device, tie_word_embeddings=True)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-4, total_steps=steps)
    for step in range(steps):
        position_ids = torch.empty(batch, seq, dtype=torch.long)
        labels = torch.randint(0, config.vocab_size, (batch, seq))
        for row in range(batch):
            start = 0
            while start < seq:
                length = min(int(torch.randint(seq // 8, seq // 2, ()).item()), seq - start)
                position_ids[row, start:start + length] = torch.arange(length)
                labels[row, start] = -100
                start += length
        input_ids = labels.clamp(min=0)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids.to(device), position_ids=position_ids.to(device),
                         labels=labels.to(device)).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {loss.item():.3f}")


def accelerate_mistral_ga4(batch: int, seq: int = 1024, size: str = "350m", updates: int = 2,
                           device: str = "cuda") -> None:
    """``accelerate.Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)``: a Mistral-style model and
    AdamW through ``prepare``, ``accumulate`` / ``backward``, clipping when gradients sync; 4 micro-batches per
    update."""
    from accelerate import Accelerator

    torch.manual_seed(10)
    accelerator = Accelerator(mixed_precision="bf16" if device == "cuda" else "no", gradient_accumulation_steps=4,
                              cpu=device == "cpu")
    config, model = _causal_lm("mistral", MISTRAL_SIZES, size, "cpu")  # on the host: prepare() moves it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    for i in range(4 * updates):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=accelerator.device)
        with accelerator.accumulate(model):
            loss = model(input_ids=input_ids, labels=input_ids).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            accelerator.print(f"update after micro-batch {i}: {loss.item():.3f}")


PROGRAMS: dict[str, Callable[..., None]] = {f.__name__: f for f in (
    neox_finetune, opt_fp16_finetune, phi3_ckpt_finetune, gemma_lora, bloom_finetune, vit_classify,
    bart_beam_generate, neox_sample_generate, packed_sft, accelerate_mistral_ga4)}


def _run(run_id: str, program: str, alloc_conf: str = "", cap_gib: float | None = None, **kwargs) -> dict:
    return {"id": run_id, "program": program, "kwargs": kwargs, "alloc_conf": alloc_conf, "cap_gib": cap_gib}


#: Recorded runs, uncapped unless a cap is given (sizes chosen by hand to peak between about 2 and 14 GiB).
RUNS: list[dict] = [
    _run("hfho2-neox410m-b8-s512-bf16", "neox_finetune", batch=8, seq=512),
    _run("hfho2-neox410m-b8-s512-bf16-eager", "neox_finetune", batch=8, seq=512, attn="eager"),
    _run("hfho2-opt350m-b8-s512-fp16", "opt_fp16_finetune", batch=8, seq=512),
    _run("hfho2-opt350m-b8-s512-fp16-exp", "opt_fp16_finetune", EXP, batch=8, seq=512),
    _run("hfho2-phi3mini8l-b4-s1024-bf16-ckpt", "phi3_ckpt_finetune", batch=4, seq=1024),
    _run("hfho2-gemma2b6l-lora-b4-s512", "gemma_lora", batch=4, seq=512),
    _run("hfho2-gemma2b6l-lora-b4-s512-cap8", "gemma_lora", cap_gib=8, batch=4, seq=512),
    _run("hfho2-bloom560m-b4-s256", "bloom_finetune", batch=4, seq=256),
    _run("hfho2-vit-base-b64-bf16", "vit_classify", batch=64),
    _run("hfho2-bart-base-beam3-b8", "bart_beam_generate", batch=8),
    _run("hfho2-neox410m-sample-b16", "neox_sample_generate", batch=16),
    _run("hfho2-qwen2-0.5b-packed-b2-s1024", "packed_sft", batch=2, seq=1024),
    _run("hfho2-mistral350m-accel-ga4-b4-s1024", "accelerate_mistral_ga4", batch=4, seq=1024),
]


def _chain(chain_id: str, program: str, cap_gib: float, start_batch: int, alloc_conf: str = "", **kwargs) -> dict:
    return {"id": chain_id, "program": program, "kwargs": kwargs, "alloc_conf": alloc_conf, "cap_gib": cap_gib,
            "start_batch": start_batch}


#: Largest-batch searches under a cap (doubling from start_batch, then bisection).
CHAINS: list[dict] = [
    _chain("hfho2-vit-base-bf16-cap8", "vit_classify", 8, 64),
    _chain("hfho2-neox410m-s512-bf16-cap12", "neox_finetune", 12, 8, seq=512),
]

#: The recorder's --cpu-check: these keyword arguments replace the plan's (where the program takes them).
CPU_CHECK: dict = {"batch": 2, "seq": 48, "src_len": 40, "prompt_len": 24, "new_tokens": 8, "size": "tiny",
                   "device": "cpu"}
