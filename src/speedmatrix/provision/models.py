"""Models: synthesized locally, copied from the trained pair the package ships, or downloaded.

A synthesized model's weights are never written: vLLM serves them with
``--load-format dummy`` (random values). What is written is what vLLM needs to
build the model and serve text: ``config.json``, a tokenizer trained here on the
repository's own corpus, and a manifest (``speedmatrix-model.json``) with the
recipe and the hash of every file, so a run records exactly which model it
measured. The trained pair (speedmatrix.provision.training) has real weights; a Hub model
is pinned to a commit.
"""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..core import atomic
from ..core.errors import ModelError
from ..measure import corpus

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2

# A chat template in Gemma's turn format, so chat endpoints work on the tiny model.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Architecture recipes. Sizes are the smallest that exercise Gemma 4's real
# structure in vLLM: a sliding-window layer and a global (full) attention layer.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-gemma4": {
        "kind": "target",
        "vocab_size": 1024,
        "config": {
            "architectures": ["Gemma4ForCausalLM"],
            "model_type": "gemma4_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 32,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 128,
            "max_position_embeddings": 8192,
            "vocab_size_per_layer_input": 1024,
            "hidden_size_per_layer_input": 16,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
    },
    "tiny-gemma4-assistant": {
        "kind": "drafter",
        "vocab_size": 1024,
        "config": {
            "architectures": ["Gemma4AssistantForCausalLM"],
            "model_type": "gemma4_assistant",
            "backbone_hidden_size": 64,
            "use_ordered_embeddings": False,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "text_config": {
                "model_type": "gemma4_text",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 32,
                "global_head_dim": 32,
                "layer_types": ["full_attention"],
                "sliding_window": 128,
                "max_position_embeddings": 8192,
                "vocab_size_per_layer_input": 0,
                "hidden_size_per_layer_input": 0,
                "tie_word_embeddings": True,
            },
        },
    },
}

# Gemma-4-31B's shape with random weights (served with --load-format dummy): a real model's serving
# speed for users without the gated weights. Speculative acceptance and output quality on random
# weights mean nothing; the report says so. The tokenizer covers the full vocabulary: merges trained
# on the repository's text, then placeholder tokens up to 262,144 ids, so any id the random model
# emits decodes. `allow_global_per_layer_attribute_access` lets transformers 5.17 load the per-layer
# head sizes (checked on CUDA vLLM 0.25.1: it then gives every layer head_dim 256).
PRESETS["gemma4-31b-shape"] = {
    "kind": "target",
    "vocab_size": 262144,
    "train_vocab_size": 32000,
    "config": {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 60,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_global_key_value_heads": 4,
        "attention_k_eq_v": True,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "sliding_window": 1024,
        "max_position_embeddings": 262144,
        "vocab_size_per_layer_input": 0,
        "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "allow_global_per_layer_attribute_access": True,
    },
}

# a second target of another width, for side-by-side model comparisons on the CPU (seed 003's shape)
PRESETS["tiny-gemma4-wide"] = copy.deepcopy(PRESETS["tiny-gemma4"])
PRESETS["tiny-gemma4-wide"]["config"].update(hidden_size=128, intermediate_size=512)

MANIFEST = "speedmatrix-model.json"

# the trained pair the package ships (speedmatrix.provision.training writes it): its folder, its two models, its log
TRAINED_DIR = Path(str(resources.files("speedmatrix") / "data" / "models"))
TRAINED_TARGET, TRAINED_DRAFTER = "tiny-gemma4-trained", "tiny-gemma4-trained-mtp"
TRAINED_EAGLE = "tiny-gemma4-trained-eagle"  # an EAGLE head for the same target (speedmatrix.provision.training)
TRAINING_LOG = "training.json"


def pad_vocabulary(tok, vocab_size: int):
    """Fill a trained tokenizer's vocabulary with ``<unused_N>`` tokens up to ``vocab_size`` ids.

    They are ordinary vocabulary entries (no merge produces them, so encoding never does), which
    decode to their own name: a random-weight model of a real vocabulary's size can emit any id."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in data.get("added_tokens", [])}
    n = 0
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<unused_{n}>"] = i
            n += 1
    return Tokenizer.from_str(json.dumps(data))


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on the repository corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.all_text().split("\n\n"), trainer=trainer)
    return tok


def _with_token_ids(cfg: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    cfg.update(vocab_size=vocab_size, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)
    if "text_config" in cfg:
        cfg["text_config"].update(
            vocab_size=vocab_size, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID
        )
    return cfg


def write_tokenizer_files(out: Path, tok, max_length: int) -> None:
    """The tokenizer, its config (special tokens, Gemma's chat template) and the generation config."""
    atomic.write_bytes(out / "tokenizer.json", tok.to_str().encode())
    atomic.write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "model_max_length": max_length,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    atomic.write_json(
        out / "generation_config.json",
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
    )


def file_hashes(directory: Path) -> dict[str, str]:
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[str(p.relative_to(directory))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def synthesize(preset: str, out_dir: str | Path, overrides: dict[str, Any] | None = None) -> dict:
    """Write a dummy-weight model directory for ``preset``; return its manifest."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    recipe = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(recipe.get("train_vocab_size", recipe["vocab_size"]))
    if tok.get_vocab_size() < recipe["vocab_size"] and "train_vocab_size" in recipe:
        tok = pad_vocabulary(tok, recipe["vocab_size"])
    vocab = tok.get_vocab_size()
    cfg = _with_token_ids(recipe["config"], vocab)
    if overrides:
        cfg.update(overrides)
    atomic.write_json(out / "config.json", cfg)
    write_tokenizer_files(out, tok, cfg.get("max_position_embeddings", 8192))
    manifest = {
        "source": "synthesize",
        "preset": preset,
        "kind": recipe["kind"],
        "weights": "dummy (served with --load-format dummy: random values, nothing on disk)",
        "vocab_size": vocab,
        "files": file_hashes(out),
    }
    atomic.write_json(out / MANIFEST, manifest)
    return manifest


def load_manifest(model_dir: str | Path) -> dict:
    return atomic.read_json(Path(model_dir) / MANIFEST)


def eos_text(model_dir: str | Path) -> str | None:
    """The end-of-text token as text (``eos_token`` of tokenizer_config.json), or None if not stated."""
    path = Path(model_dir) / "tokenizer_config.json"
    try:
        tok = atomic.read_json(path).get("eos_token")
    except (OSError, ValueError):
        return None
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) and tok else None


# ---------------------------------------------------------------------------
# models from the Hugging Face Hub, pinned to a commit


def _scrub(text: str) -> str:
    """Remove the Hub token's value from a message, wherever a library put it."""
    import os

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = os.environ.get(name)
        if value:
            text = text.replace(value, "<redacted>")
    return text


def snapshot_files(snapshot: Path) -> dict[str, dict[str, Any]]:
    """Each file of a cache snapshot with the Hub's hash of it: the blob it links to is named by its
    sha256 (LFS files) or git blob sha1; files are not re-read (weights can be tens of GB)."""
    out = {}
    for p in sorted(snapshot.rglob("*")):
        if p.is_file():
            blob = Path(p.resolve()).name if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(snapshot))] = {"blob": blob, "size": p.stat().st_size}
    return out


def download(name: str, repo: str, revision: str, out_dir: str | Path,
             allow_patterns: list[str] | None = None) -> dict[str, Any]:
    """Download ``repo`` at ``revision`` into the Hugging Face cache (or find it there) and write the
    model's manifest: the commit it resolved to and every file's hash.

    A gated repository needs ``HF_TOKEN`` in the environment; huggingface_hub
    reads it from there, and this module never prints, records or repeats it.
    With ``HF_HUB_OFFLINE=1`` only the cache is used.
    """
    from huggingface_hub import constants, errors, snapshot_download

    where = f"model {name!r} ({repo} at revision {revision})"
    try:
        path = Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=allow_patterns))
    except errors.LocalEntryNotFoundError:
        why = ("downloads are off (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else
               f"the Hub ({constants.ENDPOINT}) could not be reached")
        raise ModelError(
            f"{where} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: run once with network "
            "access, or populate the cache (HF_HUB_CACHE / HF_HOME) from a machine that has it") from None
    except errors.GatedRepoError:
        raise ModelError(f"{where} is gated: accept its license on huggingface.co, then export HF_TOKEN "
                         "with a token that may read it") from None
    except errors.RepositoryNotFoundError:
        raise ModelError(f"{where}: no such repository, or it is private or gated and HF_TOKEN is not set "
                         "or may not read it") from None
    except errors.RevisionNotFoundError:
        raise ModelError(f"{where}: the repository has no such revision (a commit sha, branch or tag)") from None
    except Exception as exc:  # network and HTTP errors: say which model, never the token
        raise ModelError(_scrub(f"{where}: {type(exc).__name__}: {exc}")) from None
    commit = path.name
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "source": "huggingface",
        "repo": repo,
        "revision_requested": revision,
        "revision": commit,
        "pinned": revision == commit,
        "local_dir": str(path),
        "allow_patterns": allow_patterns,
        "files": snapshot_files(path),
    }
    atomic.write_json(out / MANIFEST, manifest)
    return manifest


def install_trained(shipped: str, out_dir: str | Path, root: Path | None = None) -> dict[str, Any]:
    """Copy a model of the trained pair shipped with the package (speedmatrix.provision.training) into ``out_dir``,
    checked file by file against the hashes its training recorded."""
    root = root or TRAINED_DIR
    log_path = root / TRAINING_LOG
    if not log_path.exists():
        raise ModelError(f"no trained models at {root} (no {TRAINING_LOG}): `speedmatrix train-pair` trains them")
    record = atomic.read_json(log_path)
    if shipped not in record.get("files", {}):
        raise ModelError(f"{root} has no trained model {shipped!r} (it has: {', '.join(record.get('files', {}))})")
    src = root / shipped
    if file_hashes(src) != record["files"][shipped]:
        raise ModelError(f"the files of {src} differ from the hashes {log_path} recorded for them: restore them "
                         "(git checkout) or train the pair again (`speedmatrix train-pair`)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in record["files"][shipped]:
        atomic.write_bytes(out / name, (src / name).read_bytes())
    manifest = {
        "source": "trained",
        "trained": shipped,
        "kind": "drafter" if shipped in (TRAINED_DRAFTER, TRAINED_EAGLE) else "target",
        "weights": "trained (speedmatrix.provision.training: its recipe, corpus and loss in training.json)",
        "training": ({k: (record.get("eagle") or {}).get(k) for k in ("seconds", "eval", "parameters", "recipe")}
                     if shipped == TRAINED_EAGLE else
                     {k: record.get(k) for k in ("seconds", "train_tokens", "target_eval_loss", "drafter_eval",
                                                 "target_parameters", "drafter_parameters", "corpus")}),
        "files": file_hashes(out),
    }
    atomic.write_json(out / MANIFEST, manifest)
    return manifest


def prepare(name: str, spec: dict[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """The model stage: synthesize a preset, copy a shipped trained model, or download a Hub repository at
    its revision."""
    if "synthesize" in spec:
        return synthesize(spec["synthesize"], out_dir)
    if "trained" in spec:
        return install_trained(spec["trained"], out_dir)
    return download(name, spec["repo"], spec["revision"], out_dir, spec.get("allow_patterns"))


def lock(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """models.lock: per model, where it came from, the commit (or recipe) and the file hashes."""
    out = {}
    for name, m in sorted(manifests.items()):
        entry = {k: m.get(k) for k in ("source", "repo", "revision_requested", "revision", "pinned", "preset",
                                       "trained", "kind", "weights", "training") if m.get(k) is not None}
        entry["files"] = m.get("files", {})
        out[name] = entry
    return {"models": out}
