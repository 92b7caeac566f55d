"""Hugging Face programs of the field, the HELD-OUT set: the same kinds as ``hf.py`` (causal-LM full fine-tuning,
peft adapters, encoder masked-LM, seq2seq, ``generate()``, accelerate, GradScaler fp16, bf16 autocast) with other
models, sizes, options and code (batches built with ``pad_sequence``, SFT prompt masking, parameter groups, fused
AdamW, loss computed outside the model, beam search, sampling, encoder-decoder generation, DoRA, LoHa, prefix
tuning, ``modules_to_save``).

HELD OUT: never use these programs or their recordings to tune, fit or debug a predictor. They exist to check
one from outside, once, after it is done; a rule read off them makes the check worthless.

Each program is a plain function a user's script would be: a model from a config with random weights (no hub
download), random token ids, masks and labels as a tokenizer and a collator would make them, a few training steps
(or one ``generate()`` call) with the loss logged. Keyword arguments: ``batch``, the sequence lengths (tokens),
``size`` (a named config; ``"tiny"`` exists only for the CPU check), options, and ``device`` (``"cuda"``; the
recorder's ``--cpu-check`` passes ``"cpu"``). ``RUNS`` and ``CHAINS`` are the H200 recording plan
(``evaluation/record_programs.py``); peak figures in comments are rough hand estimates to keep 8 parallel runs
within the card, no prediction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.utils.rnn import pad_sequence

EXP = "expandable_segments:True"

SMOLLM_SIZES = {  # LLaMA architecture, tied embeddings
    "tiny": {"hidden_size": 48, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 3,
             "num_key_value_heads": 1, "vocab_size": 1200},
    "135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3, "vocab_size": 49152},  # SmolLM-135M's config
}
GPT2_SIZES = {
    "tiny": {"n_embd": 96, "n_layer": 2, "n_head": 4, "vocab_size": 1200, "bos_token_id": 1199, "eos_token_id": 1199},
    "medium": {"n_embd": 1024, "n_layer": 24, "n_head": 16},  # gpt2-medium, 355M
}
MISTRAL_SIZES = {
    "tiny": {"hidden_size": 80, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 5,
             "num_key_value_heads": 1, "vocab_size": 1200},
    "290m": {"hidden_size": 1280, "intermediate_size": 4480, "num_hidden_layers": 10, "num_attention_heads": 20,
             "num_key_value_heads": 4, "vocab_size": 32768},
    "0.9b": {"hidden_size": 2048, "intermediate_size": 7168, "num_hidden_layers": 14, "num_attention_heads": 16,
             "num_key_value_heads": 8, "vocab_size": 32768},
}
QWEN2_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1200, "pad_token_id": 1199, "eos_token_id": 1199},
    "0.5b-6l": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 6, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151936, "pad_token_id": 151643, "eos_token_id": 151643},
    "1.5b-4l": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 4, "num_attention_heads": 12,
                "num_key_value_heads": 2, "vocab_size": 151936, "pad_token_id": 151643, "eos_token_id": 151643},
}
LLAMA_SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 1200},
    "600m": {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 16, "num_attention_heads": 12,
             "num_key_value_heads": 4, "vocab_size": 32000},
}
DISTILBERT_SIZES = {
    "tiny": {"dim": 64, "hidden_dim": 256, "n_layers": 2, "n_heads": 2, "vocab_size": 1200},
    "base": {"dim": 768, "hidden_dim": 3072, "n_layers": 6, "n_heads": 12},  # distilbert-base-uncased
}
BERT_SIZES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
             "vocab_size": 1200},
    "large-12l": {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16,
                  "intermediate_size": 4096},
}
XLMR_SIZES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
             "vocab_size": 1200},
    "base-6l": {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 3072,
                "vocab_size": 250002},  # xlm-roberta-base's vocabulary, half its layers
}
T5_SIZES = {  # T5 v1.1: gated-GELU, untied output layer
    "tiny": {"d_model": 48, "d_ff": 96, "d_kv": 16, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 3,
             "vocab_size": 1200},
    "base": {"d_model": 768, "d_ff": 2048, "d_kv": 64, "num_layers": 12, "num_heads": 12, "vocab_size": 32128},
}
BART_SIZES = {
    "tiny": {"d_model": 96, "encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 4,
             "decoder_attention_heads": 4, "encoder_ffn_dim": 192, "decoder_ffn_dim": 192, "vocab_size": 1200},
    "large": {"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
              "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
              "vocab_size": 50265},  # bart-large, 406M
}


def collate(sequences: list[torch.Tensor], pad_token_id: int, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """A collator: pad token-id sequences to the longest with ``pad_token_id`` on ``padding_side``;
    ``{"input_ids", "attention_mask"}``, int64 on the host."""
    if padding_side == "left":
        sequences = [s.flip(0) for s in sequences]
    input_ids = pad_sequence(sequences, batch_first=True, padding_value=pad_token_id)
    attention_mask = pad_sequence([torch.ones_like(s) for s in sequences], batch_first=True, padding_value=0)
    if padding_side == "left":
        input_ids, attention_mask = input_ids.flip(1), attention_mask.flip(1)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def random_texts(n: int, max_len: int, vocab_size: int, min_len: int = 16) -> list[torch.Tensor]:
    """``n`` token-id sequences of random lengths in [min(min_len, max_len), max_len], the first one max_len long
    (ids from 5 up, below the specials)."""
    lengths = torch.randint(min(min_len, max_len), max_len + 1, (n,)).tolist()
    lengths[0] = max_len
    return [torch.randint(5, vocab_size, (length,)) for length in lengths]


def smollm_finetune(batch: int, seq: int = 1024, size: str = "135m", attn: str = "sdpa", bf16: bool = True,
                    gradient_checkpointing: bool = False, steps: int = 3, device: str = "cuda") -> None:
    """A SmolLM-style small LLaMA (30 thin layers, tied embeddings) fine-tuned with fused AdamW; fp32 weights,
    bf16 autocast unless ``bf16`` is False."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(42)
    config = AutoConfig.for_model("llama", **SMOLLM_SIZES[size], tie_word_embeddings=True,
                                  max_position_embeddings=2048, rope_theta=10000.0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)

    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss={loss.item():.4f}")


def gpt2_medium_finetune(batch: int, seq: int = 512, size: str = "medium", attn: str = "eager",
                         precision: str = "fp16", gradient_checkpointing: bool = False, steps: int = 2,
                         device: str = "cuda") -> None:
    """GPT-2 medium on right-padded batches (padding with the eos token, masked, labels -100);
    ``precision`` "fp16" (autocast + GradScaler) or "fp32"; Adam with weight decay, clip_grad_norm_."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    config = GPT2Config(**GPT2_SIZES[size], n_positions=1024, attn_implementation=attn)
    model = GPT2LMHeadModel(config).to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    pad = config.eos_token_id

    for step in range(steps):
        inputs = collate(random_texts(batch, seq, config.vocab_size, min_len=seq // 4), pad)
        labels = inputs["input_ids"].clone()
        labels[inputs["attention_mask"] == 0] = -100
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=precision == "fp16"):
            loss = model(**inputs, labels=labels.to(device)).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}, grad norm {norm.item():.3f}, scale {scaler.get_scale()}")


def mistral_sft(batch: int, seq: int = 1024, size: str = "290m", sliding_window: int | None = 256,
                dtype: str = "float32", gradient_checkpointing: bool = True, steps: int = 3,
                device: str = "cuda") -> None:
    """Supervised fine-tuning of a Mistral-style model (sliding-window attention narrower than the sequence):
    prompt + answer rows of random lengths, loss on the answer only, weight decay on matrices only (two
    parameter groups), AdamW, linear warmup."""
    from transformers import AutoModelForCausalLM, MistralConfig, get_scheduler

    torch.manual_seed(7)
    config = MistralConfig(**MISTRAL_SIZES[size], sliding_window=sliding_window, max_position_embeddings=4096,
                           pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-5)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=1, num_training_steps=steps)
    model.train()

    for step in range(steps):
        rows = random_texts(batch, seq, config.vocab_size, min_len=seq // 2)
        prompt_lengths = [len(r) // 4 for r in rows]
        inputs = collate(rows, config.pad_token_id)
        labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        for i, n in enumerate(prompt_lengths):
            labels[i, :n] = -100
        out = model(input_ids=inputs["input_ids"].to(device), attention_mask=inputs["attention_mask"].to(device),
                    labels=labels.to(device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {out.loss.item():.4f}")


def qwen2_autocast_finetune(batch: int, seq: int = 512, size: str = "1.5b-4l", tie_embeddings: bool = True,
                            attn: str = "sdpa", steps: int = 3, device: str = "cuda") -> None:
    """A Qwen2-style model (Qwen2-1.5B's widths, 4 layers) with fp32 weights under bf16 autocast, AdamW with a
    cosine schedule; tied or untied embeddings."""
    from transformers import AutoConfig, AutoModelForCausalLM, get_scheduler

    torch.manual_seed(3)
    config = AutoConfig.for_model("qwen2", **QWEN2_SIZES[size], tie_word_embeddings=tie_embeddings,
                                  max_position_embeddings=32768)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95))
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=steps)

    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
        attention_mask = torch.ones(batch, seq, dtype=torch.long).to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step} | loss {loss.item():.3f} | lr {scheduler.get_last_lr()[0]:.2e}")


def lora_sft(batch: int, seq: int = 1024, size: str = "0.9b", base_dtype: str = "bfloat16", r: int = 16,
             use_dora: bool = False, train_lm_head: bool = False, bf16_autocast: bool = False,
             gradient_checkpointing: bool = True, steps: int = 3, device: str = "cuda") -> None:
    """LoRA on every linear layer (rank-stabilised) of a frozen Mistral-style base in ``base_dtype``, as peft's
    SFT guides set it up: gradient checkpointing with ``use_reentrant=False``, input embeddings requiring grad;
    options: DoRA (``use_dora``), a fully trained output layer (``modules_to_save=["lm_head"]``), bf16
    autocast. Right-padded batches, AdamW over the trainable parameters."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, MistralConfig

    torch.manual_seed(11)
    config = MistralConfig(**MISTRAL_SIZES[size], sliding_window=None, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, base_dtype))
    model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = LoraConfig(r=r, lora_alpha=r, lora_dropout=0.0, target_modules="all-linear", use_rslora=True,
                      use_dora=use_dora, modules_to_save=["lm_head"] if train_lm_head else None,
                      bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.print_trainable_parameters()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)

    model.train()
    for step in range(steps):
        inputs = collate(random_texts(batch, seq, config.vocab_size, min_len=seq // 2), config.pad_token_id)
        inputs["labels"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16_autocast):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 0.3)
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: train loss {loss.item():.4f}")


def loha_finetune(batch: int, seq: int = 512, size: str = "0.5b-6l", base_dtype: str = "bfloat16", steps: int = 3,
                  device: str = "cuda") -> None:
    """LoHa (peft's low-rank Hadamard product adapter) on the attention and MLP projections of a frozen
    Qwen2-style base, AdamW."""
    from peft import LoHaConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(5)
    config = Qwen2Config(**QWEN2_SIZES[size], tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, base_dtype)).to(device)
    loha = LoHaConfig(task_type="CAUSAL_LM", r=8, alpha=16, module_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, loha)
    model.print_trainable_parameters()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    model.train()
    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def prefix_tuning_finetune(batch: int, seq: int = 512, size: str = "600m", num_virtual_tokens: int = 32,
                           steps: int = 3, device: str = "cuda") -> None:
    """Prefix tuning (peft: learned key/value prefixes in every layer) of a frozen fp32 LLaMA-style base."""
    from peft import PrefixTuningConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(13)
    config = LlamaConfig(**LLAMA_SIZES[size], max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config)
    model = get_peft_model(model, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=num_virtual_tokens))
    model.print_trainable_parameters()
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq)).to(device)
        attention_mask = torch.ones_like(input_ids)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def _mlm_batch(batch: int, seq: int, vocab_size: int, pad_id: int, cls_id: int, sep_id: int,
               mask_id: int) -> dict[str, torch.Tensor]:
    """Padded [CLS] text [SEP] rows with 15% of the text masked (all replaced by the mask token), labels -100
    elsewhere."""
    texts = [torch.cat([torch.tensor([cls_id]), t, torch.tensor([sep_id])])
             for t in random_texts(batch, seq - 2, vocab_size, min_len=8)]
    inputs = collate(texts, pad_id)
    ids = inputs["input_ids"]
    is_text = (inputs["attention_mask"] == 1) & (ids != cls_id) & (ids != sep_id)
    chosen = (torch.rand(ids.shape) < 0.15) & is_text
    inputs["labels"] = torch.where(chosen, ids, -100)
    inputs["input_ids"] = torch.where(chosen, mask_id, ids)
    return inputs


def distilbert_mlm(batch: int, seq: int = 512, size: str = "base", precision: str = "fp16", steps: int = 3,
                   device: str = "cuda") -> None:
    """DistilBERT masked-LM on padded batches; "fp16" (autocast + GradScaler) or "fp32"; AdamW."""
    from transformers import AutoModelForMaskedLM, DistilBertConfig

    torch.manual_seed(17)
    config = DistilBertConfig(**DISTILBERT_SIZES[size])
    model = AutoModelForMaskedLM.from_config(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    for step in range(steps):
        inputs = _mlm_batch(batch, seq, config.vocab_size, config.pad_token_id, 101, 102, 103)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with torch.autocast(device, dtype=torch.float16, enabled=precision == "fp16"):
            loss = model(**inputs).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def bert_large_mlm(batch: int, seq: int = 512, size: str = "large-12l", attn: str = "eager", steps: int = 3,
                   device: str = "cuda") -> None:
    """A BERT-large-width masked LM (12 layers) under bf16 autocast on padded batches, AdamW + linear decay."""
    from transformers import AutoModelForMaskedLM, BertConfig, get_linear_schedule_with_warmup

    torch.manual_seed(19)
    config = BertConfig(**BERT_SIZES[size])
    model = AutoModelForMaskedLM.from_config(config, attn_implementation=attn)
    model.to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, steps)
    for step in range(steps):
        inputs = _mlm_batch(batch, seq, config.vocab_size, config.pad_token_id, 101, 102, 103)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(**{k: v.to(device) for k, v in inputs.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def xlmr_mlm(batch: int, seq: int = 128, size: str = "base-6l", steps: int = 3, device: str = "cuda") -> None:
    """An XLM-RoBERTa-style masked LM (a 250k vocabulary) in fp32 on padded batches, AdamW."""
    from transformers import AutoModelForMaskedLM, XLMRobertaConfig

    torch.manual_seed(23)
    config = XLMRobertaConfig(**XLMR_SIZES[size], max_position_embeddings=514)
    model = AutoModelForMaskedLM.from_config(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for step in range(steps):
        inputs = _mlm_batch(batch, seq, config.vocab_size, config.pad_token_id, config.bos_token_id,
                            config.eos_token_id, config.vocab_size - 1)
        loss = model(**{k: v.to(device) for k, v in inputs.items()}).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def t5v11_finetune(batch: int, src_len: int = 512, tgt_len: int = 128, size: str = "base", optim: str = "adamw",
                   bf16: bool = True, steps: int = 3, device: str = "cuda") -> None:
    """T5 v1.1 (gated GELU, untied output layer) seq2seq fine-tuning, fp32 weights under bf16 autocast unless
    ``bf16`` is False; ``optim`` "adamw" or "adafactor" (relative step sizes and transformers'
    AdafactorSchedule, as the Adafactor docs show)."""
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.optimization import Adafactor, AdafactorSchedule

    torch.manual_seed(29)
    config = T5Config(**T5_SIZES[size], feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      decoder_start_token_id=0, dropout_rate=0.0)
    model = T5ForConditionalGeneration(config).to(device)
    if optim == "adafactor":
        optimizer = Adafactor(model.parameters(), scale_parameter=True, relative_step=True, warmup_init=True, lr=None)
        scheduler = AdafactorSchedule(optimizer)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scheduler = None
    model.train()
    for step in range(steps):
        sources = collate(random_texts(batch, src_len, config.vocab_size), config.pad_token_id)
        targets = collate(random_texts(batch, tgt_len, config.vocab_size), config.pad_token_id)
        labels = targets["input_ids"].masked_fill(targets["attention_mask"] == 0, -100)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            outputs = model(input_ids=sources["input_ids"].to(device),
                            attention_mask=sources["attention_mask"].to(device), labels=labels.to(device))
        outputs.loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {outputs.loss.item():.3f}")


def bart_large_finetune(batch: int, src_len: int = 512, tgt_len: int = 128, size: str = "large",
                        optim: str = "adafactor", label_smoothing: float = 0.1, steps: int = 3,
                        device: str = "cuda") -> None:
    """BART-large summarization-style fine-tuning in fp32 with a label-smoothed cross-entropy computed from the
    logits (decoder inputs shifted from the labels by hand); ``optim`` "adafactor" (fixed learning rate) or
    "adamw"."""
    from transformers import BartConfig, BartForConditionalGeneration
    from transformers.models.bart.modeling_bart import shift_tokens_right
    from transformers.optimization import Adafactor

    torch.manual_seed(31)
    config = BartConfig(**BART_SIZES[size], max_position_embeddings=1024)
    model = BartForConditionalGeneration(config).to(device)
    if optim == "adafactor":
        optimizer = Adafactor(model.parameters(), lr=3e-5, relative_step=False, scale_parameter=False)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=label_smoothing)
    model.train()
    for step in range(steps):
        sources = collate(random_texts(batch, src_len, config.vocab_size), config.pad_token_id)
        targets = collate(random_texts(batch, tgt_len, config.vocab_size), config.pad_token_id)
        labels = targets["input_ids"].masked_fill(targets["attention_mask"] == 0, -100).to(device)
        decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
        logits = model(input_ids=sources["input_ids"].to(device), attention_mask=sources["attention_mask"].to(device),
                       decoder_input_ids=decoder_input_ids,
                       decoder_attention_mask=targets["attention_mask"].to(device)).logits
        loss = loss_fn(logits.view(-1, logits.size(-1)), labels.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


def qwen2_generate(batch: int, prompt_len: int = 200, new_tokens: int = 100, size: str = "1.5b-4l",
                   cache: str = "static", do_sample: bool = True, device: str = "cuda") -> None:
    """Sampling (top-p) from a bf16 Qwen2-style model on left-padded prompts of random lengths, with the static
    KV cache (``cache_implementation="static"``, eager: ``disable_compile=True``) or the dynamic one."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    torch.manual_seed(37)
    config = Qwen2Config(**QWEN2_SIZES[size], tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    model.eval()
    prompts = collate(random_texts(batch, prompt_len, config.vocab_size), config.pad_token_id, padding_side="left")
    generation_config = GenerationConfig(max_new_tokens=new_tokens, do_sample=do_sample, top_p=0.9, temperature=0.7,
                                         pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id,
                                         cache_implementation=cache, disable_compile=True)
    with torch.no_grad():
        out = model.generate(**{k: v.to(device) for k, v in prompts.items()}, generation_config=generation_config)
    print(out.shape)


def smollm_beam_search(batch: int, prompt_len: int = 64, new_tokens: int = 48, size: str = "135m",
                       num_beams: int = 4, device: str = "cuda") -> None:
    """Beam search (dynamic KV cache) from a SmolLM-style model in fp16 on unpadded prompts."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(41)
    config = LlamaConfig(**SMOLLM_SIZES[size], tie_word_embeddings=True, max_position_embeddings=2048)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float16).to(device).eval()
    input_ids = torch.randint(5, config.vocab_size, (batch, prompt_len), device=device)
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                         num_beams=num_beams, early_stopping=True, pad_token_id=0)
    print(out.shape)


def t5_generate(batch: int, src_len: int = 512, new_tokens: int = 64, size: str = "base", cache: str = "dynamic",
                device: str = "cuda") -> None:
    """Greedy encoder-decoder ``generate()`` from a bf16 T5 v1.1 on padded sources; ``cache`` "dynamic" or
    "static" (eager)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(43)
    config = T5Config(**T5_SIZES[size], feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    model = T5ForConditionalGeneration(config).to(device=device, dtype=torch.bfloat16).eval()
    sources = collate(random_texts(batch, src_len, config.vocab_size), config.pad_token_id)
    out = model.generate(input_ids=sources["input_ids"].to(device), attention_mask=sources["attention_mask"].to(device),
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, cache_implementation=cache,
                         disable_compile=True)
    print(out.shape)


def accelerate_qwen2(batch: int, seq: int = 512, size: str = "0.5b-6l", mixed_precision: str = "fp16",
                     gradient_accumulation_steps: int = 2, gradient_checkpointing: bool = False, steps: int = 2,
                     device: str = "cuda") -> None:
    """A Qwen2-style model trained through accelerate with gradient accumulation: a DataLoader over a list of
    tokenized rows with a padding collator, ``accelerator.prepare``/``accumulate``/``backward``; "fp16" or
    "bf16" mixed precision."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(47)
    accelerator = Accelerator(gradient_accumulation_steps=gradient_accumulation_steps,
                              mixed_precision=mixed_precision, cpu=device == "cpu")
    config = Qwen2Config(**QWEN2_SIZES[size], tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    rows = random_texts(batch * gradient_accumulation_steps * steps, seq, config.vocab_size, min_len=seq // 2)

    def collate_fn(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        out = collate(items, config.pad_token_id)
        out["labels"] = out["input_ids"].masked_fill(out["attention_mask"] == 0, -100)
        return out

    loader = DataLoader(rows, batch_size=batch, collate_fn=collate_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for i, inputs in enumerate(loader):
        with accelerator.accumulate(model):
            loss = model(**inputs).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            accelerator.print(f"update after batch {i}: loss {loss.item():.3f}")


PROGRAMS: dict[str, Callable[..., None]] = {f.__name__: f for f in (
    smollm_finetune, gpt2_medium_finetune, mistral_sft, qwen2_autocast_finetune, lora_sft, loha_finetune,
    prefix_tuning_finetune, distilbert_mlm, bert_large_mlm, xlmr_mlm, t5v11_finetune, bart_large_finetune,
    qwen2_generate, smollm_beam_search, t5_generate, accelerate_qwen2)}


def _run(run_id: str, program: str, alloc_conf: str = "", cap_gib: float | None = None, **kwargs) -> dict:
    return {"id": run_id, "program": program, "kwargs": kwargs, "alloc_conf": alloc_conf, "cap_gib": cap_gib}


#: Recorded runs, uncapped (each expected under ~14 GiB, so that 8 share the card), some under expandable segments.
RUNS: list[dict] = [
    _run("hfho-smollm-b8-s512-bf16", "smollm_finetune", batch=8, seq=512),
    _run("hfho-smollm-b8-s1024-bf16-ckpt", "smollm_finetune", batch=8, seq=1024, gradient_checkpointing=True),
    _run("hfho-smollm-b8-s1024-bf16-ckpt-exp", "smollm_finetune", EXP, batch=8, seq=1024,
         gradient_checkpointing=True),
    _run("hfho-smollm-b4-s512-fp32-eager", "smollm_finetune", batch=4, seq=512, bf16=False, attn="eager"),
    _run("hfho-gpt2m-b4-s512-fp16-eager", "gpt2_medium_finetune", batch=4, seq=512),
    _run("hfho-gpt2m-b4-s1024-fp16-sdpa-ckpt", "gpt2_medium_finetune", batch=4, seq=1024, attn="sdpa",
         gradient_checkpointing=True),
    _run("hfho-mistral290m-b4-s1024-sw256-ckpt", "mistral_sft", batch=4, seq=1024),
    _run("hfho-mistral290m-b4-s1024-sw256-ckpt-exp", "mistral_sft", EXP, batch=4, seq=1024),
    _run("hfho-mistral290m-b2-s2048-nosw-bf16", "mistral_sft", batch=2, seq=2048, sliding_window=None,
         dtype="bfloat16", gradient_checkpointing=False),
    _run("hfho-qwen2-1.5b4l-b2-s512-bf16", "qwen2_autocast_finetune", batch=2, seq=512),
    _run("hfho-qwen2-0.5b6l-b2-s512-untied-eager", "qwen2_autocast_finetune", batch=2, seq=512, size="0.5b-6l",
         tie_embeddings=False, attn="eager"),
    _run("hfho-lora-mistral0.9b-bf16-b4-s1024-ckpt", "lora_sft", batch=4, seq=1024),
    _run("hfho-lora-mistral0.9b-bf16-b4-s1024-ckpt-exp", "lora_sft", EXP, batch=4, seq=1024),
    _run("hfho-lora-mistral0.9b-bf16-b4-s512-head-autocast", "lora_sft", batch=4, seq=512, train_lm_head=True,
         bf16_autocast=True, gradient_checkpointing=False),
    _run("hfho-dora-mistral290m-fp32-b4-s512", "lora_sft", batch=4, seq=512, size="290m", base_dtype="float32",
         use_dora=True, r=8, gradient_checkpointing=False),
    _run("hfho-loha-qwen2-0.5b6l-bf16-b4-s512", "loha_finetune", batch=4, seq=512),
    _run("hfho-prefix-llama600m-b4-s512", "prefix_tuning_finetune", batch=4, seq=512),
    _run("hfho-distilbert-b16-s512-fp16", "distilbert_mlm", batch=16, seq=512),
    _run("hfho-distilbert-b32-s256-fp32-exp", "distilbert_mlm", EXP, batch=32, seq=256, precision="fp32"),
    _run("hfho-bertlarge-b8-s512-eager-bf16", "bert_large_mlm", batch=8, seq=512),
    _run("hfho-bertlarge-b16-s256-sdpa-bf16", "bert_large_mlm", batch=16, seq=256, attn="sdpa"),
    _run("hfho-xlmr-b8-s128", "xlmr_mlm", batch=8, seq=128),
    _run("hfho-t5v11base-b8-adamw-bf16", "t5v11_finetune", batch=8),
    _run("hfho-t5v11base-b8-adafactor-fp32", "t5v11_finetune", batch=8, optim="adafactor", bf16=False),
    _run("hfho-bartlarge-b8-adafactor", "bart_large_finetune", batch=8),
    _run("hfho-bartlarge-b4-adamw-exp", "bart_large_finetune", EXP, batch=4, optim="adamw"),
    _run("hfho-gen-qwen2-b64-static-sample", "qwen2_generate", batch=64),
    _run("hfho-gen-qwen2-b16-dynamic-sample", "qwen2_generate", batch=16, cache="dynamic"),
    _run("hfho-gen-smollm-b8-beam4", "smollm_beam_search", batch=8),
    _run("hfho-gen-t5v11-b16-dynamic", "t5_generate", batch=16),
    _run("hfho-gen-t5v11-b16-static-exp", "t5_generate", EXP, batch=16, cache="static"),
    _run("hfho-accel-qwen2-fp16-b4-s512-ga2", "accelerate_qwen2", batch=4, seq=512),
    _run("hfho-accel-qwen2-bf16-b4-s512-ga2-ckpt", "accelerate_qwen2", batch=4, seq=512, mixed_precision="bf16",
         gradient_checkpointing=True),
]


def _entry(run_id: str) -> dict:
    return next(r for r in RUNS if r["id"] == run_id)

#: Capped 3% either side of the cliff the predictor gave blind (docs/predict-blind-hf*.txt), added after the
#: blind prediction and before any recording of this set was read: fits/OOM away from the cliff.
RUNS += [
    {**_entry("hfho-smollm-b8-s1024-bf16-ckpt"),
     "id": "hfho-smollm-b8-s1024-bf16-ckpt-capm3", "cap_gib": 7.29},
    {**_entry("hfho-smollm-b8-s1024-bf16-ckpt"),
     "id": "hfho-smollm-b8-s1024-bf16-ckpt-capp3", "cap_gib": 7.741},
    {**_entry("hfho-lora-mistral0.9b-bf16-b4-s1024-ckpt"),
     "id": "hfho-lora-mistral0.9b-bf16-b4-s1024-ckpt-capm3", "cap_gib": 4.251},
    {**_entry("hfho-lora-mistral0.9b-bf16-b4-s1024-ckpt"),
     "id": "hfho-lora-mistral0.9b-bf16-b4-s1024-ckpt-capp3", "cap_gib": 4.514},
    {**_entry("hfho-bertlarge-b8-s512-eager-bf16"),
     "id": "hfho-bertlarge-b8-s512-eager-bf16-capm3", "cap_gib": 8.732},
    {**_entry("hfho-bertlarge-b8-s512-eager-bf16"),
     "id": "hfho-bertlarge-b8-s512-eager-bf16-capp3", "cap_gib": 9.272},
    {**_entry("hfho-t5v11base-b8-adafactor-fp32"),
     "id": "hfho-t5v11base-b8-adafactor-fp32-capm3", "cap_gib": 8.351},
    {**_entry("hfho-t5v11base-b8-adafactor-fp32"),
     "id": "hfho-t5v11base-b8-adafactor-fp32-capp3", "cap_gib": 8.868},
    {**_entry("hfho-gpt2m-b4-s1024-fp16-sdpa-ckpt"),
     "id": "hfho-gpt2m-b4-s1024-fp16-sdpa-ckpt-capm3", "cap_gib": 9.658},
    {**_entry("hfho-gpt2m-b4-s1024-fp16-sdpa-ckpt"),
     "id": "hfho-gpt2m-b4-s1024-fp16-sdpa-ckpt-capp3", "cap_gib": 10.256},
    {**_entry("hfho-dora-mistral290m-fp32-b4-s512"),
     "id": "hfho-dora-mistral290m-fp32-b4-s512-capm3", "cap_gib": 6.294},
    {**_entry("hfho-dora-mistral290m-fp32-b4-s512"),
     "id": "hfho-dora-mistral290m-fp32-b4-s512-capp3", "cap_gib": 6.683},
]


def _chain(chain_id: str, program: str, cap_gib: float, start_batch: int, alloc_conf: str = "", **kwargs) -> dict:
    return {"id": chain_id, "program": program, "kwargs": kwargs, "alloc_conf": alloc_conf, "cap_gib": cap_gib,
            "start_batch": start_batch}


#: Largest-batch searches under a cap (doubling from start_batch, then bisection).
CHAINS: list[dict] = [
    _chain("hfho-smollm-s1024-bf16-ckpt-cap12", "smollm_finetune", 12, 8, seq=1024, gradient_checkpointing=True),
    _chain("hfho-lora-mistral0.9b-bf16-s1024-ckpt-cap8", "lora_sft", 8, 4, seq=1024),
    _chain("hfho-distilbert-s512-fp16-cap8-exp", "distilbert_mlm", 8, 16, EXP, seq=512),
    _chain("hfho-bartlarge-adafactor-cap12", "bart_large_finetune", 12, 8),
]

#: The recorder's --cpu-check: these keyword arguments replace the plan's (where the program takes them).
CPU_CHECK: dict = {"batch": 2, "seq": 48, "src_len": 40, "tgt_len": 24, "prompt_len": 24, "new_tokens": 8,
                   "size": "tiny", "device": "cpu"}
