"""Train the tiny Gemma-4 pair on the CPU: a target and its MTP drafter, with fixed seeds.

The default experiment serves real weights, so that generated text, speculative
acceptance, loop verdicts and quality gates mean something. The recipe
(``RECIPE``) is small enough for two cores:

* **corpus**: the top-level modules of this Python's standard library (code, with
  docstrings and comments as prose; the interpreter's version and the corpus's
  sha256 are logged; 2 % of the modules, whole, are held out for the loss) and
  the package's own prose and code corpora, which the cells cut their prompts
  from (several copies);
* **tokenizer**: byte-level BPE trained on that corpus;
* **target** (``Gemma4ForCausalLM``, a sliding and a full attention layer): next
  token cross-entropy, AdamW, a cosine schedule;
* **drafter** (``Gemma4AssistantForCausalLM``, vLLM's MTP): distilled from the
  frozen target in vLLM's convention. A draft step at anchor ``p`` takes the
  target's (scaled) embedding of token ``p+1`` and the target's final hidden
  state at ``p``, and its query-only layers read the target's keys and values of
  positions ``0..p`` at position ``p`` (every step of a draft keeps the anchor's
  position, ``constant_draft_positions`` in vLLM's Gemma-4 proposer); step ``k``
  is trained towards the target's distribution of token ``p+k+1`` (KL), with
  the next step fed the step's own hidden state and the true token.

* **EAGLE head** (``EagleLlamaForCausalLM``, vLLM's ``eagle`` method): one Llama
  decoder layer over ``fc([embedding of token p+1; the target's final hidden state
  at p])``, the layer's input norm left out and no final norm, the target's
  (tied) embedding table as its input embedding and its output head, as vLLM
  shares them; distilled from the frozen target (KL to its distribution of token
  ``p+2``), a second step fed the first step's own hidden state and the true token
  attending to the first step's keys, as vLLM's proposer drafts.

All three are written as safetensors (bf16) with the tokenizer, ``config.json`` and a
training log. The result is not bit-identical across CPUs or thread counts
(floating-point reduction order); the shipped files' hashes are in
``models.lock`` of every run that serves them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import atomic
from ..measure import corpus
from .models import TRAINED_DIR, TRAINED_DRAFTER, TRAINED_TARGET, TRAINING_LOG

# where the shipped pair lives, its names (an experiment's ``trained:``) and its log: speedmatrix.provision.models
SHIPPED, TARGET, DRAFTER, LOG = TRAINED_DIR, TRAINED_TARGET, TRAINED_DRAFTER, TRAINING_LOG

RECIPE: dict[str, Any] = {
    "seed": 1234,
    "vocab_size": 4096,
    "seq_len": 256,
    "batch": 16,
    "eval_fraction": 0.02,
    "stdlib": True,  # the standard library's modules in the corpus (off: the package's corpora alone)
    "package_corpus_repeats": 8,
    "target": {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 32,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 128,
        "steps": 700,
        "lr": 3e-3,
        "warmup": 40,
    },
    "drafter": {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "layer_types": ["full_attention"],
        "steps": 400,
        "lr": 3e-3,
        "warmup": 20,
        "unrolled_steps": 2,
    },
    # an EAGLE head (vLLM's EagleLlamaForCausalLM, method eagle) for the same frozen target
    "eagle": {
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "rope_theta": 10000.0,
        "steps": 400,
        "lr": 3e-3,
        "warmup": 20,
        "unrolled_steps": 2,
    },
}


def recipe_with(changes: dict[str, Any] | None) -> dict[str, Any]:
    """The recipe with ``changes`` (one level deep for ``target``, ``drafter`` and ``eagle``)."""
    out = copy.deepcopy(RECIPE)
    for key, value in (changes or {}).items():
        if isinstance(value, dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def corpus_documents(recipe: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(training documents, held-out documents, where they came from). Whole standard-library modules are
    held out (a seeded ``eval_fraction`` of them); the package's corpora, which prompts are cut from, are
    all trained on (``package_corpus_repeats`` copies). Without the standard library the held-out text is
    one copy of the package's corpora (then the loss measures memorising, enough to see it fall)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py")) if recipe["stdlib"] else []
    modules = [p.read_text("utf-8", errors="replace") for p in files]
    own = [corpus.text(k) for k in corpus.KINDS]
    held_idx = set(random.Random(recipe["seed"]).sample(range(len(modules)),
                                                        max(1, round(len(modules) * recipe["eval_fraction"])))
                   if modules else [])
    held = [m for i, m in enumerate(modules) if i in held_idx] or own
    train = [m for i, m in enumerate(modules) if i not in held_idx] + own * recipe["package_corpus_repeats"]
    digest = hashlib.sha256("\x00".join(modules + own).encode()).hexdigest()
    return train, held, {"stdlib": str(stdlib), "python": sys.version.split()[0], "stdlib_modules": len(modules),
                         "held_out_modules": sorted(files[i].name for i in held_idx),
                         "characters": sum(map(len, train)), "sha256": digest}


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from .models import SPECIAL_TOKENS

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def token_stream(tok, docs: list[str]):
    """Every document's ids, each followed by <eos>, as one long tensor."""
    import torch

    from .models import EOS_ID

    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def target_config(vocab_size: int, recipe: dict[str, Any]) -> dict[str, Any]:
    from .models import BOS_ID, EOS_ID, PAD_ID

    t = recipe["target"]
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": vocab_size,
        **{k: t[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "head_dim", "global_head_dim", "layer_types", "sliding_window")},
        "max_position_embeddings": 8192, "vocab_size_per_layer_input": 0, "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
    }


def drafter_config(vocab_size: int, recipe: dict[str, Any]) -> dict[str, Any]:
    from .models import BOS_ID, EOS_ID, PAD_ID

    t, d = recipe["target"], recipe["drafter"]
    return {
        "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
        "backbone_hidden_size": t["hidden_size"], "use_ordered_embeddings": False, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "vocab_size": vocab_size,
        "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
        "text_config": {
            "model_type": "gemma4_text", "vocab_size": vocab_size,
            **{k: d[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "layer_types")},
            # it reads the target's keys and values: their heads and size
            "num_key_value_heads": t["num_key_value_heads"], "head_dim": t["head_dim"],
            "global_head_dim": t["global_head_dim"], "sliding_window": t["sliding_window"],
            "max_position_embeddings": 8192, "vocab_size_per_layer_input": 0, "hidden_size_per_layer_input": 0,
            "tie_word_embeddings": True, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
        },
    }


def _lr(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _batches(stream, seq_len: int, batch: int, gen):
    """Random windows of ``seq_len + 1`` tokens, ``batch`` at a time, forever."""
    import torch

    n = len(stream) - seq_len - 1
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen)
        yield torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()])


def _eval_windows(stream, seq_len: int, count: int = 16):
    import torch

    step = max(1, (len(stream) - seq_len - 1) // count)
    return torch.stack([stream[i:i + seq_len + 1] for i in range(0, step * count, step)][:count])


def _build(config_cls, model_cls, cfg: dict[str, Any]):
    """A model from the recipe's config (its keys for vLLM, architectures and model_type, left out)."""
    return model_cls(config_cls(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type",
                                                                              "torch_dtype")}))


def _fit(name: str, model, part: dict[str, Any], batches, loss_of: Callable, evaluate: Callable[[], dict],
         train_key: str, log: Callable[[dict], None]) -> None:
    """``part["steps"]`` steps of AdamW (warmup, then a cosine schedule; gradients clipped at 1), logging the
    training loss and ``evaluate()`` (in eval mode) every 50 steps and at the end."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    steps = part["steps"]
    opt = torch.optim.AdamW(params, lr=part["lr"], weight_decay=0.01)

    def evaluated() -> dict:
        model.eval()
        try:
            return evaluate()
        finally:
            model.train()

    log({"model": name, "step": 0, **evaluated()})
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, part["lr"], part["warmup"])
        loss = loss_of(next(batches))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if (step + 1) % 50 == 0 or step + 1 == steps:
            log({"model": name, "step": step + 1, train_key: round(float(loss.detach()), 4), **evaluated()})
    model.eval()


def _target_loss(model, window):
    out = model(input_ids=window[:, :-1], labels=window[:, 1:].contiguous())
    return out.loss


def run_training(out_dir: str | Path, changes: dict[str, Any] | None = None,
                 progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the pair (``RECIPE`` with ``changes``) into ``out_dir/<TARGET>`` and ``out_dir/<DRAFTER>``, with
    the training record in ``out_dir/training.json``; returns the record."""
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

    from .models import write_tokenizer_files

    recipe = recipe_with(changes)
    out = Path(out_dir)
    t0 = time.monotonic()
    random.seed(recipe["seed"])
    torch.manual_seed(recipe["seed"])
    train_docs, held_docs, source = corpus_documents(recipe)
    tok = train_tokenizer(train_docs, recipe["vocab_size"])
    vocab = tok.get_vocab_size()
    train, held = token_stream(tok, train_docs), token_stream(tok, held_docs)
    seq_len, batch = recipe["seq_len"], recipe["batch"]
    record: dict[str, Any] = {"recipe": recipe, "corpus": source, "vocab_size": vocab, "train_tokens": len(train),
                              "eval_tokens": len(held), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "log": []}
    evals = _eval_windows(held, seq_len)

    def log(entry: dict) -> None:
        entry = {"t_s": round(time.monotonic() - t0, 1), **entry}
        record["log"].append(entry)
        progress(json.dumps(entry))

    # ---- the target, then the drafter distilled from it (frozen)
    tcfg_dict, dcfg_dict = target_config(vocab, recipe), drafter_config(vocab, recipe)
    target = _build(Gemma4TextConfig, Gemma4ForCausalLM, tcfg_dict)
    record["target_parameters"] = sum(p.numel() for p in target.parameters())
    batches = _batches(train, seq_len, batch, torch.Generator().manual_seed(recipe["seed"]))

    def eval_target() -> dict[str, Any]:
        with torch.no_grad():
            return {"eval_loss": round(float(_target_loss(target, evals)), 4)}

    _fit("target", target, recipe["target"], batches, lambda w: _target_loss(target, w), eval_target, "train_loss",
         log)
    record["target_eval_loss"] = record["log"][-1]["eval_loss"]
    for p in target.parameters():
        p.requires_grad_(False)
    drafter = _build(Gemma4AssistantConfig, Gemma4AssistantForCausalLM, dcfg_dict)
    record["drafter_parameters"] = sum(p.numel() for p in drafter.parameters())
    unrolled = recipe["drafter"]["unrolled_steps"]

    def eval_drafter() -> dict[str, Any]:
        with torch.no_grad():
            kl, agree = draft_losses(target, drafter, evals, unrolled)
        return {"eval_kl": [round(float(x), 4) for x in kl], "eval_top1_agreement": [round(float(x), 4)
                                                                                      for x in agree]}

    def drafter_loss(window):
        kl, _ = draft_losses(target, drafter, window, unrolled)
        return sum(kl) / len(kl)

    _fit("drafter", drafter, recipe["drafter"], batches, drafter_loss, eval_drafter, "train_kl", log)
    record["drafter_eval"] = {k: record["log"][-1][k] for k in ("eval_kl", "eval_top1_agreement")}
    record["seconds"] = round(time.monotonic() - t0, 1)

    for name, model, cfg in ((TARGET, target, tcfg_dict), (DRAFTER, drafter, dcfg_dict)):
        d_out = out / name
        d_out.mkdir(parents=True, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(d_out, safe_serialization=True)
        atomic.write_json(d_out / "config.json", cfg)  # the recipe's config as written (transformers adds keys)
        write_tokenizer_files(d_out, tok, cfg.get("max_position_embeddings", 8192))
    record["files"] = shipped_hashes(out)
    atomic.write_json(out / LOG, record)
    # the EAGLE head for the target just trained (it adds its record and hashes to the log)
    run_eagle_training(out, changes, progress)
    return atomic.read_json(out / LOG)


def shipped_hashes(root: Path) -> dict[str, dict[str, str]]:
    """Each trained model in ``root`` (the target, its drafter, its EAGLE head once trained): its files' sha256."""
    from .models import TRAINED_EAGLE, file_hashes

    return {name: file_hashes(root / name) for name in (TARGET, DRAFTER, TRAINED_EAGLE) if (root / name).is_dir()}


def draft_losses(target, drafter, window, unrolled: int):
    """Per draft step k (1..unrolled): the KL from the target's next-token distribution at ``p+k`` to the
    drafter's at anchor ``p``, and how often their top tokens agree, over every anchor of ``window``."""
    import torch
    import torch.nn.functional as F

    ids = window[:, :-1]
    b, n = ids.shape
    with torch.no_grad():
        tout = target.model(input_ids=ids, return_shared_kv_states=True)
        hidden = tout.last_hidden_state  # the final post-norm hidden state at each position
        kv = dict(tout.shared_kv_states)
        tlogits = target.lm_head(hidden)
        cap = target.config.final_logit_softcapping
        if cap:
            tlogits = torch.tanh(tlogits / cap) * cap
        tprobs = F.log_softmax(tlogits.float(), dim=-1)
        emb = target.model.embed_tokens(ids)  # scaled, as vLLM's drafter embeds its inputs
    anchors = n - unrolled  # anchor p needs tokens up to p + unrolled
    pos = torch.arange(anchors).unsqueeze(0).expand(b, -1)
    # query p reads keys 0..p (the target has processed up to the anchor)
    allowed = torch.arange(n).unsqueeze(0) <= torch.arange(anchors).unsqueeze(1)
    mask = torch.where(allowed, 0.0, float("-inf"))[None, None]
    masks = {"full_attention": mask, "sliding_attention": mask}
    h = hidden[:, :anchors]
    kls, agree = [], []
    for k in range(1, unrolled + 1):
        x = drafter.pre_projection(torch.cat([emb[:, k:k + anchors], h], dim=-1))
        out = drafter.model(inputs_embeds=x, attention_mask=masks, position_ids=pos, shared_kv_states=kv,
                            use_cache=False)
        last = out.last_hidden_state
        logp = F.log_softmax(drafter.lm_head(last).float(), dim=-1)
        want = tprobs[:, k:k + anchors]  # the target's distribution of token p+k+1
        kls.append(F.kl_div(logp, want, log_target=True, reduction="batchmean") / anchors)
        agree.append((logp.argmax(-1) == want.argmax(-1)).float().mean())
        h = drafter.post_projection(last)
    return kls, agree


def eagle_config(vocab_size: int, recipe: dict[str, Any]):
    """The EAGLE head's configuration (transformers' LlamaConfig, as vLLM reads it): the target's width and
    attention shape, the recipe's depth and MLP."""
    from transformers import LlamaConfig

    from .models import BOS_ID, EOS_ID, PAD_ID

    t, e = recipe["target"], recipe["eagle"]
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=t["hidden_size"], intermediate_size=e["intermediate_size"],
                      num_hidden_layers=e["num_hidden_layers"], num_attention_heads=e["num_attention_heads"],
                      num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
                      max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=e["rope_theta"],
                      tie_word_embeddings=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)
    cfg._attn_implementation = "eager"  # the additive mask of the unrolled step
    return cfg


def eagle_config_dict(cfg) -> dict[str, Any]:
    """config.json of the head: vLLM's architecture name, the config's keys as transformers writes them."""
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
            "rope_parameters", "attention_bias", "mlp_bias", "tie_word_embeddings", "bos_token_id", "eos_token_id",
            "pad_token_id")
    d = cfg.to_dict()
    return {"architectures": ["EagleLlamaForCausalLM"], **{k: d[k] for k in keys}, "torch_dtype": "bfloat16"}


def eagle_head(cfg):
    """The head's trainable part, named as vLLM loads it: ``fc``, ``layers.N`` (the first without its input norm)."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    head = torch.nn.Module()
    head.fc = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
    head.layers = torch.nn.ModuleList(LlamaDecoderLayer(cfg, layer_idx=i) for i in range(cfg.num_hidden_layers))
    del head.layers[0].input_layernorm
    head.layers[0].input_layernorm = torch.nn.Identity()
    head.rope = LlamaRotaryEmbedding(cfg)
    return head


def eagle_state_dict(head) -> dict[str, Any]:
    """The head's weights as vLLM's EagleLlamaForCausalLM loads them (the rotary tables are computed, not loaded)."""
    import torch

    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()
            if not k.startswith("rope.")}


def _eagle_forward(head, x, positions, mask):
    cos_sin = head.rope(x, positions)
    for layer in head.layers:
        x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)
    return x


def eagle_mask(anchors: int, steps: int):
    """Which keys each query of ``steps`` draft steps over ``anchors`` anchors may read (True: may), rows and columns
    ordered step by step (step j's anchor p at ``(j-1)*anchors + p``): every step of anchor p reads step 1 at
    anchors up to p (what vLLM's cache holds when the draft starts) and the steps of its own draft so far."""
    import torch

    step = torch.arange(steps).repeat_interleave(anchors)
    anchor = torch.arange(anchors).repeat(steps)
    first = (step[None, :] == 0) & (anchor[None, :] <= anchor[:, None])
    own = (step[None, :] > 0) & (anchor[None, :] == anchor[:, None]) & (step[None, :] <= step[:, None])
    return first | own


def eagle_losses(target, head, window, unrolled: int):
    """Per draft step k (1..unrolled): the KL from the target's distribution of token ``p+k+1`` to the head's at
    anchor ``p``, and how often their top tokens agree. Step 1 at position p takes token p+1's embedding and the
    target's hidden state at p, attending causally to step 1 at positions up to p; step k > 1 at position
    p+k-1 takes token p+k and step k-1's output, attending to step 1 at positions up to p and to the steps of
    its own draft (vLLM's proposer keeps step 1's keys from the prefill and adds each step's)."""
    import torch
    import torch.nn.functional as F

    ids = window[:, :-1]
    b, n = ids.shape
    with torch.no_grad():
        hidden = target.model(input_ids=ids).last_hidden_state  # the final post-norm hidden state
        table = target.model.embed_tokens.weight  # vLLM's EAGLE embeds with the table itself (no Gemma scaling)
        tlogits = target.lm_head(hidden)
        cap = target.config.final_logit_softcapping
        if cap:
            tlogits = torch.tanh(tlogits / cap) * cap
        tprobs = F.log_softmax(tlogits.float(), dim=-1)
        emb = F.embedding(ids, table)
    a = n - unrolled  # anchors: p = 0..a-1
    pos1 = torch.arange(a).unsqueeze(0).expand(b, -1)
    inputs, positions = [head.fc(torch.cat([emb[:, 1:1 + a], hidden[:, :a]], dim=-1))], [pos1]
    kls, agree = [], []
    h = None
    for k in range(1, unrolled + 1):
        if k > 1:  # the next step: token p+k, the previous step's output
            inputs.append(head.fc(torch.cat([emb[:, k:k + a], h], dim=-1)))
            positions.append(pos1 + k - 1)
        x, pos = torch.cat(inputs, dim=1), torch.cat(positions, dim=1)
        mask = torch.where(eagle_mask(a, k), 0.0, float("-inf"))[None, None]
        out = _eagle_forward(head, x, pos, mask)[:, (k - 1) * a:k * a]
        logp = F.log_softmax((out @ table.T).float(), dim=-1)
        want = tprobs[:, k:k + a]  # the target's distribution of token p+k+1
        kls.append(F.kl_div(logp, want, log_target=True, reduction="batchmean") / a)
        agree.append((logp.argmax(-1) == want.argmax(-1)).float().mean())
        h = out
    return kls, agree


def run_eagle_training(root: str | Path = SHIPPED, changes: dict[str, Any] | None = None,
                       progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the EAGLE head for the trained target in ``root`` (frozen, as shipped) on the recipe's corpus with the
    target's own tokenizer; write ``root/<EAGLE>`` and its record into ``root/training.json`` (``eagle``, and the
    head's file hashes beside the pair's). Returns the head's record."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import Gemma4ForCausalLM

    from .models import TRAINED_EAGLE, file_hashes

    recipe = recipe_with(changes)
    root = Path(root)
    t0 = time.monotonic()
    torch.manual_seed(recipe["seed"])
    target = Gemma4ForCausalLM.from_pretrained(root / TARGET, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tok = Tokenizer.from_file(str(root / TARGET / "tokenizer.json"))
    train_docs, held_docs, source = corpus_documents(recipe)
    train, held = token_stream(tok, train_docs), token_stream(tok, held_docs)
    evals = _eval_windows(held, recipe["seq_len"])
    cfg = eagle_config(tok.get_vocab_size(), recipe)
    head = eagle_head(cfg)
    unrolled = recipe["eagle"]["unrolled_steps"]
    record: dict[str, Any] = {"recipe": recipe["eagle"], "corpus_sha256": source["sha256"],
                              "parameters": sum(v.numel() for v in eagle_state_dict(head).values()), "log": []}

    def log(entry: dict) -> None:
        entry = {"t_s": round(time.monotonic() - t0, 1), **entry}
        record["log"].append(entry)
        progress(json.dumps(entry))

    def evaluate() -> dict[str, Any]:
        with torch.no_grad():
            kl, agree = eagle_losses(target, head, evals, unrolled)
        return {"eval_kl": [round(float(x), 4) for x in kl],
                "eval_top1_agreement": [round(float(x), 4) for x in agree]}

    def loss(window):
        kl, _ = eagle_losses(target, head, window, unrolled)
        return sum(kl) / len(kl)

    batches = _batches(train, recipe["seq_len"], recipe["batch"], torch.Generator().manual_seed(recipe["seed"]))
    _fit("eagle", head, recipe["eagle"], batches, loss, evaluate, "train_kl", log)
    record["eval"] = {k: record["log"][-1][k] for k in ("eval_kl", "eval_top1_agreement")}
    record["seconds"] = round(time.monotonic() - t0, 1)
    out = root / TRAINED_EAGLE
    out.mkdir(parents=True, exist_ok=True)
    save_file(eagle_state_dict(head), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = eagle_config_dict(cfg)
    atomic.write_json(out / "config.json", config)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):  # the target's, as they are
        atomic.write_bytes(out / name, (root / TARGET / name).read_bytes())
    full = atomic.read_json(root / LOG)
    full["eagle"] = record
    full["files"][TRAINED_EAGLE] = file_hashes(out)
    atomic.write_json(root / LOG, full)
    return record
