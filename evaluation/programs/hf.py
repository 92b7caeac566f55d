"""Hugging Face programs of the field, the development set: what people fine-tuning language models run.

Each program is a plain function a user's script would be: build a model from a config with random weights
(no hub download), move it to the GPU, make random token ids, attention masks and labels as a tokenizer and a
collator would, then run a few training steps (or one ``generate()`` call), logging the loss. Keyword
arguments: ``batch`` (sequences per step), the sequence lengths (tokens), ``size`` (a named config of the
module's tables; ``"tiny"`` exists only for the CPU check), options, and ``device`` (``"cuda"``; the
recorder's ``--cpu-check`` passes ``"cpu"``).

``RUNS`` and ``CHAINS`` are the H200 recording plan (``evaluation/record_programs.py``): peaks uncapped, some
under expandable segments, and largest-batch searches under a cap. Peak estimates in the comments are rough
hand figures (weights + gradients + optimizer states + activations), only to keep parallel runs off each
other's memory; they are no prediction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EXP = "expandable_segments:True"

GPT2_SIZES = {
    "tiny": {"n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 128, "bos_token_id": 999,
             "eos_token_id": 999},
    "small": {"n_embd": 768, "n_layer": 12, "n_head": 12},  # gpt2, 124M
}
LLAMA_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1000},
    "160m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
             "num_key_value_heads": 12, "vocab_size": 32000},
    "400m": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 6, "num_attention_heads": 16,
             "num_key_value_heads": 4, "vocab_size": 32000},
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 32000},
}
MISTRAL_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1000},
    "240m": {"hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 12, "num_attention_heads": 16,
             "num_key_value_heads": 8, "vocab_size": 32000},
}
QWEN2_SIZES = {
    "tiny": {"hidden_size": 56, "intermediate_size": 304, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 1000},
    "0.5b-8l": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 8, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151936},  # Qwen2-0.5B's widths, 8 of its 24 layers
}
BERT_SIZES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256,
             "vocab_size": 1000},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}
ROBERTA_SIZES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256,
             "vocab_size": 1000},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
             "vocab_size": 50265},
}
T5_SIZES = {
    "tiny": {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_heads": 4, "vocab_size": 1000},
    "small": {"d_model": 512, "d_ff": 2048, "d_kv": 64, "num_layers": 6, "num_heads": 8, "vocab_size": 32128},
}
BART_SIZES = {
    "tiny": {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
             "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 1000},
    "base": {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
             "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 50265},
}


def padded_batch(batch: int, seq: int, vocab_size: int, pad_token_id: int, side: str = "right",
                 min_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a tokenizer returns for ``batch`` texts of random lengths (``min_len``..``seq`` tokens, default
    half of ``seq``) padded to ``seq``: ``(input_ids, attention_mask)``, int64 on the host; the longest row has
    no padding."""
    lengths = torch.randint(min_len or seq // 2, seq + 1, (batch,))
    lengths[0] = seq
    positions = torch.arange(seq).expand(batch, seq)
    if side == "left":
        attention_mask = (positions >= seq - lengths[:, None]).long()
    else:
        attention_mask = (positions < lengths[:, None]).long()
    input_ids = torch.randint(3, vocab_size, (batch, seq))
    input_ids[attention_mask == 0] = pad_token_id
    return input_ids, attention_mask


def mask_tokens(input_ids: torch.Tensor, special: torch.Tensor, mask_token_id: int, vocab_size: int,
                probability: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking, as transformers' DataCollatorForLanguageModeling does it on the host: 15% of the
    non-special tokens become targets; of those 80% are replaced by the mask token, 10% by a random token.
    Returns ``(input_ids, labels)`` with -100 where there is no target."""
    labels = input_ids.clone()
    probability_matrix = torch.full(labels.shape, probability)
    probability_matrix.masked_fill_(special, 0.0)
    masked = torch.bernoulli(probability_matrix).bool()
    labels[~masked] = -100
    input_ids = input_ids.clone()
    replaced = torch.bernoulli(torch.full(labels.shape, 0.8)).bool() & masked
    input_ids[replaced] = mask_token_id
    random_words = torch.bernoulli(torch.full(labels.shape, 0.5)).bool() & masked & ~replaced
    input_ids[random_words] = torch.randint(vocab_size, labels.shape)[random_words]
    return input_ids, labels


def gpt2_finetune(batch: int, seq: int = 512, size: str = "small", attn: str = "sdpa", precision: str = "fp32",
                  gradient_checkpointing: bool = False, steps: int = 3, device: str = "cuda") -> None:
    """GPT-2 (tied input/output embeddings) full fine-tuning: AdamW, linear warmup/decay, clip_grad_norm_.
    ``precision``: "fp32", "bf16" (autocast) or "fp16" (autocast + GradScaler)."""
    from transformers import AutoModelForCausalLM, GPT2Config, get_linear_schedule_with_warmup

    torch.manual_seed(0)
    config = GPT2Config(**GPT2_SIZES[size])
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()

    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=steps)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")

    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        attention_mask = torch.ones_like(input_ids)
        with torch.autocast(device_type=device, dtype=amp_dtype, enabled=amp_dtype is not None):
            outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids)
        loss = outputs.loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f} lr {scheduler.get_last_lr()[0]:.2e}")


def llama_finetune(batch: int, seq: int = 512, size: str = "160m", attn: str = "sdpa", tie_embeddings: bool = False,
                   gradient_checkpointing: bool = False, padding: bool = False, steps: int = 3,
                   device: str = "cuda") -> None:
    """A LLaMA-style causal LM (RMSNorm, rotary, SwiGLU, grouped-query attention) trained in fp32 with AdamW and
    a cosine schedule. ``padding``: right-padded rows of random lengths, the padding masked out and ignored in
    the loss (labels -100), as an SFT collator makes them; otherwise every token is real."""
    from transformers import AutoModelForCausalLM, LlamaConfig, get_cosine_schedule_with_warmup

    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_SIZES[size], max_position_embeddings=2048, tie_word_embeddings=tie_embeddings,
                         pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
    model = model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.train()

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=steps)
    for step in range(steps):
        if padding:
            input_ids, attention_mask = padded_batch(batch, seq, config.vocab_size, config.pad_token_id)
        else:
            input_ids = torch.randint(0, config.vocab_size, (batch, seq))
            attention_mask = torch.ones(batch, seq, dtype=torch.long)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        input_ids, attention_mask, labels = input_ids.to(device), attention_mask.to(device), labels.to(device)

        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f} grad_norm {grad_norm.item():.2f}")


def mistral_finetune(batch: int, seq: int = 1024, size: str = "240m", sliding_window: int | None = 4096,
                     steps: int = 3, device: str = "cuda") -> None:
    """A Mistral-style causal LM (sliding-window attention) in fp32 weights under bf16 autocast, AdamW."""
    from transformers import AutoModelForCausalLM, MistralConfig

    torch.manual_seed(0)
    config = MistralConfig(**MISTRAL_SIZES[size], sliding_window=sliding_window, max_position_embeddings=4096)
    model = AutoModelForCausalLM.from_config(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(input_ids, attention_mask=torch.ones_like(input_ids), labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def qwen2_finetune(batch: int, seq: int = 512, size: str = "0.5b-8l", attn: str = "sdpa", dtype: str = "bfloat16",
                   steps: int = 3, device: str = "cuda") -> None:
    """A Qwen2-style causal LM (biased q/k/v, tied embeddings, a 152k vocabulary) trained with its weights in
    ``dtype`` (pure bf16 training by default: weights, gradients and AdamW's states all bf16)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**QWEN2_SIZES[size], tie_word_embeddings=True, max_position_embeddings=4096)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation=attn)
    model.to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)

    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
        outputs = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=input_ids)
        outputs.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {outputs.loss.item():.3f}")


def lora_finetune(batch: int, seq: int = 512, size: str = "1b", base_dtype: str = "bfloat16", r: int = 16,
                  target_modules: str = "qv", gradient_checkpointing: bool = False, steps: int = 3,
                  device: str = "cuda") -> None:
    """LoRA (peft.get_peft_model) over a frozen LLaMA-style base in ``base_dtype``; AdamW over the adapters.
    ``target_modules``: "qv" (q_proj, v_proj) or "all-linear". With gradient checkpointing, the input embeddings
    are made to require grad (``enable_input_require_grads``) as peft's guides do."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_SIZES[size], max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, base_dtype)).to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    targets = ["q_proj", "v_proj"] if target_modules == "qv" else target_modules
    lora_config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=r, lora_alpha=2 * r, lora_dropout=0.05,
                             target_modules=targets)
    model = get_peft_model(model, lora_config)
    model.print_trainable_parameters()

    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    model.train()
    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        attention_mask = torch.ones(batch, seq, dtype=torch.long, device=device)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def ia3_finetune(batch: int, seq: int = 512, size: str = "0.5b-8l", base_dtype: str = "float32", steps: int = 3,
                 device: str = "cuda") -> None:
    """IA³ (learned rescaling of keys, values and the MLP's down projection input) over a frozen Qwen2-style base,
    AdamW over the few trainable vectors, a linear schedule."""
    from peft import IA3Config, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config, get_linear_schedule_with_warmup

    torch.manual_seed(0)
    config = Qwen2Config(**QWEN2_SIZES[size], tie_word_embeddings=True, max_position_embeddings=4096)
    base = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, base_dtype))
    peft_config = IA3Config(task_type="CAUSAL_LM", target_modules=["k_proj", "v_proj", "down_proj"],
                            feedforward_modules=["down_proj"])
    model = get_peft_model(base, peft_config)
    model.print_trainable_parameters()
    model.to(device)

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, steps)
    model.train()
    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
        out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=input_ids)
        out.loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {out.loss.item():.3f}")


def bert_mlm(batch: int, seq: int = 256, size: str = "base", attn: str = "sdpa", precision: str = "fp32",
             steps: int = 3, device: str = "cuda") -> None:
    """BERT masked-LM pre-training steps on padded batches (random lengths, attention mask with zeros), 15%
    masking done on the host as the collator does; AdamW, linear schedule. ``precision``: "fp32" or "fp16"
    (autocast + GradScaler)."""
    from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup

    torch.manual_seed(0)
    config = BertConfig(**BERT_SIZES[size], attn_implementation=attn)
    model = BertForMaskedLM(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=steps)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    cls_id, sep_id, mask_id = 1, 2, 3

    for step in range(steps):
        input_ids, attention_mask = padded_batch(batch, seq, config.vocab_size, config.pad_token_id)
        input_ids[:, 0] = cls_id
        lengths = attention_mask.sum(dim=1)
        input_ids[torch.arange(batch), lengths - 1] = sep_id
        special = (attention_mask == 0) | (input_ids == cls_id) | (input_ids == sep_id)
        input_ids, labels = mask_tokens(input_ids, special, mask_id, config.vocab_size)
        batch_on_device = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
                           "labels": labels.to(device)}

        with torch.autocast(device_type=device, dtype=torch.float16, enabled=precision == "fp16"):
            loss = model(**batch_on_device).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: mlm loss {loss.item():.3f}")


def roberta_mlm(batch: int, seq: int = 256, size: str = "base", steps: int = 3, device: str = "cuda") -> None:
    """RoBERTa masked-LM steps on padded batches under bf16 autocast (fp32 weights), AdamW."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    config = RobertaConfig(**ROBERTA_SIZES[size], max_position_embeddings=seq + 2)
    model = RobertaForMaskedLM(config)
    model.to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    bos_id, eos_id, mask_id = config.bos_token_id, config.eos_token_id, 4

    for step in range(steps):
        input_ids, attention_mask = padded_batch(batch, seq, config.vocab_size, config.pad_token_id)
        input_ids[:, 0] = bos_id
        input_ids[torch.arange(batch), attention_mask.sum(1) - 1] = eos_id
        special = (attention_mask == 0) | (input_ids == bos_id) | (input_ids == eos_id)
        input_ids, labels = mask_tokens(input_ids, special, mask_id, config.vocab_size)
        input_ids, attention_mask, labels = (t.to(device) for t in (input_ids, attention_mask, labels))

        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def t5_finetune(batch: int, src_len: int = 512, tgt_len: int = 128, size: str = "small", optim: str = "adafactor",
                steps: int = 3, device: str = "cuda") -> None:
    """T5 seq2seq fine-tuning (padded sources, padded targets ignored in the loss), fp32. ``optim``:
    "adafactor" (transformers' Adafactor with a fixed learning rate, as its docs advise for T5) or "adamw"."""
    from transformers import Adafactor, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(**T5_SIZES[size], decoder_start_token_id=0)  # as t5-small's config.json has it
    model = T5ForConditionalGeneration(config).to(device)
    model.train()
    if optim == "adafactor":
        optimizer = Adafactor(model.parameters(), lr=1e-3, scale_parameter=False, relative_step=False,
                              warmup_init=False)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    for step in range(steps):
        input_ids, attention_mask = padded_batch(batch, src_len, config.vocab_size, config.pad_token_id)
        labels, label_mask = padded_batch(batch, tgt_len, config.vocab_size, config.pad_token_id)
        labels[label_mask == 0] = -100
        loss = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                     labels=labels.to(device)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def bart_finetune(batch: int, src_len: int = 512, tgt_len: int = 128, size: str = "base", optim: str = "adamw",
                  steps: int = 3, device: str = "cuda") -> None:
    """BART seq2seq fine-tuning (summarization-shaped: long padded sources, short targets), fp32; ``optim``:
    "adamw" (with a linear schedule) or "adafactor" (transformers' Adafactor, relative step sizes)."""
    from transformers import Adafactor, BartConfig, BartForConditionalGeneration, get_linear_schedule_with_warmup

    torch.manual_seed(0)
    config = BartConfig(**BART_SIZES[size], max_position_embeddings=1024)
    model = BartForConditionalGeneration(config)
    model.to(device)
    model.train()
    if optim == "adafactor":
        optimizer = Adafactor(model.parameters(), lr=None, scale_parameter=True, relative_step=True,
                              warmup_init=True)
        scheduler = None
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
        scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=steps)

    for step in range(steps):
        input_ids, attention_mask = padded_batch(batch, src_len, config.vocab_size, config.pad_token_id)
        labels, label_mask = padded_batch(batch, tgt_len, config.vocab_size, config.pad_token_id)
        labels = labels.masked_fill(label_mask == 0, -100)
        outputs = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                        labels=labels.to(device))
        outputs.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {outputs.loss.item():.3f}")


def llama_generate(batch: int, prompt_len: int = 128, new_tokens: int = 64, size: str = "1b",
                   cache: str = "dynamic", dtype: str = "bfloat16", device: str = "cuda") -> None:
    """Greedy ``generate()`` from a LLaMA-style model in ``dtype`` on left-padded prompts of random lengths.
    ``cache``: "dynamic" (transformers' default, grown per token) or "static" (``cache_implementation="static"``,
    preallocated for prompt + new tokens). transformers compiles the decoding step when the cache is static
    on a GPU; ``disable_compile=True`` keeps eager execution (compilation is out of this set's scope)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_SIZES[size], max_position_embeddings=2048, pad_token_id=0)
    with torch.device(device):  # built on the GPU: no host copy of the weights
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.eval()
    input_ids, attention_mask = padded_batch(batch, prompt_len, config.vocab_size, config.pad_token_id,
                                             side="left")
    output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                            max_new_tokens=new_tokens, do_sample=False, cache_implementation=cache,
                            pad_token_id=config.pad_token_id, disable_compile=True)
    print(f"generated {output.shape[1] - prompt_len} tokens for {output.shape[0]} prompts")


def accelerate_finetune(batch: int, seq: int = 512, size: str = "160m", mixed_precision: str = "bf16",
                        gradient_accumulation_steps: int = 1, steps: int = 3, device: str = "cuda") -> None:
    """A LLaMA-style causal LM trained through ``accelerate.Accelerator(mixed_precision=...)``: a DataLoader of
    host token ids, ``accelerator.prepare`` of model/optimizer/loader/scheduler, ``accelerator.backward``,
    ``accelerator.clip_grad_norm_``; "bf16" or "fp16" (accelerate's GradScaler)."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset
    from transformers import AutoModelForCausalLM, LlamaConfig, get_linear_schedule_with_warmup

    torch.manual_seed(0)
    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=device == "cpu",
                              gradient_accumulation_steps=gradient_accumulation_steps)
    config = LlamaConfig(**LLAMA_SIZES[size], max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n_batches = steps * gradient_accumulation_steps
    dataset = TensorDataset(torch.randint(0, config.vocab_size, (batch * n_batches, seq)))
    loader = DataLoader(dataset, batch_size=batch, shuffle=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    for i, (input_ids,) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = model(input_ids=input_ids, labels=input_ids).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        accelerator.print(f"batch {i}: loss {loss.item():.3f}")


PROGRAMS: dict[str, Callable[..., None]] = {f.__name__: f for f in (
    gpt2_finetune, llama_finetune, mistral_finetune, qwen2_finetune, lora_finetune, ia3_finetune, bert_mlm,
    roberta_mlm, t5_finetune, bart_finetune, llama_generate, accelerate_finetune)}


def _run(run_id: str, program: str, alloc_conf: str = "", cap_gib: float | None = None, **kwargs) -> dict:
    return {"id": run_id, "program": program, "kwargs": kwargs, "alloc_conf": alloc_conf, "cap_gib": cap_gib}


#: Recorded runs: uncapped (cap_gib None) to record peaks; each expected to peak under ~14 GiB so that 8 of
#: them share the 139 GiB card. Ids say program, size, batch, sequence and options.
RUNS: list[dict] = [
    # GPT-2 small: SDPA/eager, fp32 / bf16 autocast / fp16 GradScaler, gradient checkpointing
    _run("hf-gpt2-b8-s512", "gpt2_finetune", batch=8, seq=512),
    _run("hf-gpt2-b4-s512-eager", "gpt2_finetune", batch=4, seq=512, attn="eager"),
    _run("hf-gpt2-b16-s512-bf16", "gpt2_finetune", batch=16, seq=512, precision="bf16"),
    _run("hf-gpt2-b8-s1024-fp16", "gpt2_finetune", batch=8, seq=1024, precision="fp16"),
    _run("hf-gpt2-b8-s1024-bf16-ckpt", "gpt2_finetune", batch=8, seq=1024, precision="bf16",
         gradient_checkpointing=True),
    _run("hf-gpt2-b8-s512-exp", "gpt2_finetune", EXP, batch=8, seq=512),
    # LLaMA-style: sizes, eager, tied, padding, gradient checkpointing
    _run("hf-llama160m-b8-s512", "llama_finetune", batch=8, seq=512, size="160m"),
    _run("hf-llama160m-b8-s512-eager", "llama_finetune", batch=8, seq=512, size="160m", attn="eager"),
    _run("hf-llama160m-b8-s512-tied", "llama_finetune", batch=8, seq=512, size="160m", tie_embeddings=True),
    _run("hf-llama160m-b8-s512-pad", "llama_finetune", batch=8, seq=512, size="160m", padding=True),
    _run("hf-llama160m-b8-s512-pad-eager", "llama_finetune", batch=8, seq=512, size="160m", padding=True,
         attn="eager"),
    _run("hf-llama400m-b4-s512", "llama_finetune", batch=4, seq=512, size="400m"),
    _run("hf-llama400m-b4-s1024-ckpt", "llama_finetune", batch=4, seq=1024, size="400m",
         gradient_checkpointing=True),
    _run("hf-llama400m-b4-s1024-ckpt-exp", "llama_finetune", EXP, batch=4, seq=1024, size="400m",
         gradient_checkpointing=True),
    # Mistral-style under bf16 autocast (window wider than the sequence), Qwen2-style pure bf16
    _run("hf-mistral240m-b4-s1024-bf16", "mistral_finetune", batch=4, seq=1024),
    _run("hf-mistral240m-b4-s1024-bf16-exp", "mistral_finetune", EXP, batch=4, seq=1024),
    _run("hf-qwen2-b4-s512-bf16", "qwen2_finetune", batch=4, seq=512),
    _run("hf-qwen2-b4-s512-bf16-eager", "qwen2_finetune", batch=4, seq=512, attn="eager"),
    # peft: LoRA over frozen fp32 and bf16 LLaMA-style bases, IA3 over a fp32 Qwen2-style base
    _run("hf-lora-llama400m-fp32-b8-s512", "lora_finetune", batch=8, seq=512, size="400m", base_dtype="float32"),
    _run("hf-lora-llama1b-bf16-b8-s512", "lora_finetune", batch=8, seq=512),
    _run("hf-lora-llama1b-bf16-b8-s512-exp", "lora_finetune", EXP, batch=8, seq=512),
    _run("hf-lora-llama1b-bf16-b8-s1024-all-ckpt", "lora_finetune", batch=8, seq=1024, r=8,
         target_modules="all-linear", gradient_checkpointing=True),
    _run("hf-ia3-qwen2-fp32-b4-s512", "ia3_finetune", batch=4, seq=512),
    # encoder masked-LM on padded batches
    _run("hf-bert-b16-s256", "bert_mlm", batch=16, seq=256),
    _run("hf-bert-b16-s256-eager", "bert_mlm", batch=16, seq=256, attn="eager"),
    _run("hf-bert-b16-s512-fp16", "bert_mlm", batch=16, seq=512, precision="fp16"),
    _run("hf-roberta-b16-s256-bf16", "roberta_mlm", batch=16, seq=256),
    _run("hf-roberta-b16-s256-bf16-exp", "roberta_mlm", EXP, batch=16, seq=256),
    # seq2seq: T5 and BART with Adafactor and AdamW
    _run("hf-t5small-b16-adafactor", "t5_finetune", batch=16),
    _run("hf-t5small-b16-adamw", "t5_finetune", batch=16, optim="adamw"),
    _run("hf-t5small-b16-adafactor-exp", "t5_finetune", EXP, batch=16),
    _run("hf-bart-b16-adamw", "bart_finetune", batch=16),
    _run("hf-bart-b16-adafactor", "bart_finetune", batch=16, optim="adafactor"),
    # generate(): dynamic and static KV cache
    _run("hf-gen-llama1b-b8-dynamic", "llama_generate", batch=8),
    _run("hf-gen-llama1b-b8-static", "llama_generate", batch=8, cache="static"),
    _run("hf-gen-llama1b-b32-p256-static-exp", "llama_generate", EXP, batch=32, prompt_len=256, cache="static"),
    # accelerate
    _run("hf-accel-llama160m-bf16-b8-s512", "accelerate_finetune", batch=8, seq=512),
    _run("hf-accel-llama160m-fp16-b8-s512", "accelerate_finetune", batch=8, seq=512, mixed_precision="fp16"),
    _run("hf-accel-llama160m-bf16-b4-s512-ga2-exp", "accelerate_finetune", EXP, batch=4, seq=512,
         gradient_accumulation_steps=2),
]


def _entry(run_id: str) -> dict:
    return next(r for r in RUNS if r["id"] == run_id)

#: Capped 3% either side of the cliff the predictor gave blind (docs/predict-blind-hf*.txt), added after the
#: blind prediction and before any recording of this set was read: fits/OOM away from the cliff.
RUNS += [
    {**_entry("hf-gpt2-b8-s512"),
     "id": "hf-gpt2-b8-s512-capm3", "cap_gib": 9.084},
    {**_entry("hf-gpt2-b8-s512"),
     "id": "hf-gpt2-b8-s512-capp3", "cap_gib": 9.646},
    {**_entry("hf-llama400m-b4-s1024-ckpt"),
     "id": "hf-llama400m-b4-s1024-ckpt-capm3", "cap_gib": 8.993},
    {**_entry("hf-llama400m-b4-s1024-ckpt"),
     "id": "hf-llama400m-b4-s1024-ckpt-capp3", "cap_gib": 9.55},
    {**_entry("hf-lora-llama1b-bf16-b8-s512"),
     "id": "hf-lora-llama1b-bf16-b8-s512-capm3", "cap_gib": 13.057},
    {**_entry("hf-lora-llama1b-bf16-b8-s512"),
     "id": "hf-lora-llama1b-bf16-b8-s512-capp3", "cap_gib": 13.865},
    {**_entry("hf-bert-b16-s512-fp16"),
     "id": "hf-bert-b16-s512-fp16-capm3", "cap_gib": 8.321},
    {**_entry("hf-bert-b16-s512-fp16"),
     "id": "hf-bert-b16-s512-fp16-capp3", "cap_gib": 8.835},
    {**_entry("hf-t5small-b16-adafactor"),
     "id": "hf-t5small-b16-adafactor-capm3", "cap_gib": 4.725},
    {**_entry("hf-t5small-b16-adafactor"),
     "id": "hf-t5small-b16-adafactor-capp3", "cap_gib": 5.017},
    {**_entry("hf-qwen2-b4-s512-bf16"),
     "id": "hf-qwen2-b4-s512-bf16-capm3", "cap_gib": 8.452},
    {**_entry("hf-qwen2-b4-s512-bf16"),
     "id": "hf-qwen2-b4-s512-bf16-capp3", "cap_gib": 8.974},
]


def _chain(chain_id: str, program: str, cap_gib: float, start_batch: int, alloc_conf: str = "", **kwargs) -> dict:
    return {"id": chain_id, "program": program, "kwargs": kwargs, "alloc_conf": alloc_conf, "cap_gib": cap_gib,
            "start_batch": start_batch}


#: Largest-batch searches under a cap (doubling from start_batch, then bisection; one fresh process per try).
CHAINS: list[dict] = [
    _chain("hf-gpt2-s512-bf16-cap8", "gpt2_finetune", 8, 8, seq=512, precision="bf16"),
    _chain("hf-llama400m-s1024-ckpt-cap12", "llama_finetune", 12, 4, seq=1024, size="400m",
           gradient_checkpointing=True),
    _chain("hf-lora-llama1b-bf16-s512-cap8", "lora_finetune", 8, 4, seq=512),
    _chain("hf-bert-s256-cap8-exp", "bert_mlm", 8, 16, EXP, seq=256),
    _chain("hf-t5small-adafactor-cap8", "t5_finetune", 8, 8),
]

#: The recorder's --cpu-check: these keyword arguments replace the plan's (where the program takes them).
CPU_CHECK: dict = {"batch": 2, "seq": 32, "src_len": 32, "tgt_len": 16, "prompt_len": 16, "new_tokens": 8,
                   "size": "tiny", "device": "cpu"}
