"""The tiny trained pair: a short retrain lowers the losses, and the shipped files load and are what their log
says (speedmatrix.provision.training, models.install_trained). No vLLM here: the default run serves the shipped pair."""

from __future__ import annotations

import json

import pytest

from speedmatrix.provision import models, training

torch = pytest.importorskip("torch")

# a few seconds of training: the package's corpora only, short windows
QUICK = {"stdlib": False, "vocab_size": 512, "seq_len": 32, "batch": 8, "eval_fraction": 0.1,
         "target": {"steps": 30, "warmup": 3, "lr": 1e-2}, "drafter": {"steps": 20, "warmup": 2, "lr": 1e-2},
         "eagle": {"steps": 20, "warmup": 2, "lr": 1e-2}}


@pytest.fixture(scope="module")
def quick_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    torch.set_num_threads(1)
    return out, training.run_training(out, QUICK, progress=lambda m: None)


def test_a_short_retrain_lowers_the_losses(quick_pair):
    out, record = quick_pair
    target = [e for e in record["log"] if e["model"] == "target"]
    drafter = [e for e in record["log"] if e["model"] == "drafter"]
    assert target[0]["step"] == 0 and target[-1]["step"] == 30
    assert target[-1]["eval_loss"] < target[0]["eval_loss"] - 0.5, target
    # the drafter comes closer to the frozen target at both draft steps
    assert all(a < b for a, b in zip(drafter[-1]["eval_kl"], drafter[0]["eval_kl"], strict=True)), drafter
    assert record["files"] == training.shipped_hashes(out)
    assert json.loads((out / training.LOG).read_text())["target_eval_loss"] == record["target_eval_loss"]


def test_the_eagle_head_learns_and_is_written_as_vllm_loads_it(quick_pair):
    out, record = quick_pair
    log = [e for e in record["eagle"]["log"]]
    assert all(a < b for a, b in zip(log[-1]["eval_kl"], log[0]["eval_kl"], strict=True)), log
    from safetensors import safe_open

    with safe_open(out / models.TRAINED_EAGLE / "model.safetensors", "pt") as f:
        names = set(f.keys())
    # vLLM's EagleLlamaForCausalLM: fc, then its layers (the first without an input norm); the embedding and the
    # output head are the target's
    assert "fc.weight" in names and "layers.0.self_attn.q_proj.weight" in names
    assert not any("input_layernorm" in n or "embed" in n or "lm_head" in n for n in names), names
    cfg = json.loads((out / models.TRAINED_EAGLE / "config.json").read_text())
    assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["hidden_size"] == 128
    assert record["files"][models.TRAINED_EAGLE] == training.shipped_hashes(out)[models.TRAINED_EAGLE]
    assert models.install_trained(models.TRAINED_EAGLE, out / "copy", root=out)["kind"] == "drafter"


def test_the_unrolled_step_reads_what_vllms_proposer_has_cached():
    """Two draft steps over three anchors: step 2 of anchor p reads step 1 up to anchor p (not p+1: the target has
    not verified that token when the draft starts) and itself; step 1 is causal."""
    got = training.eagle_mask(3, 2).int().tolist()
    assert got == [
        # step 1, anchors 0..2 | step 2, anchors 0..2
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]


def test_a_trained_model_is_copied_checked_against_its_recorded_hashes(quick_pair, tmp_path):
    out, record = quick_pair
    manifest = models.install_trained(training.DRAFTER, tmp_path / "m", root=out)
    assert manifest["source"] == "trained" and manifest["kind"] == "drafter"
    assert {k: v for k, v in manifest["files"].items()} == record["files"][training.DRAFTER]
    lock = models.lock({"d": manifest})["models"]["d"]
    assert lock["trained"] == training.DRAFTER and lock["training"]["target_eval_loss"] == record["target_eval_loss"]
    # a changed file is refused with what to do, before any server starts
    weights = out / training.TARGET / "model.safetensors"
    saved = weights.read_bytes()
    weights.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
    try:
        with pytest.raises(models.ModelError, match="differ from the hashes"):
            models.install_trained(training.TARGET, tmp_path / "t", root=out)
    finally:
        weights.write_bytes(saved)


def test_the_shipped_pair_loads_and_is_what_its_log_says():
    """The files in the package load with transformers; the target's loss on the log's held-out windows is the
    logged one (bf16 against the fp32 it was measured in) where this Python's standard library is the corpus
    it was trained on; the drafter agrees with the target's top token more often than chance."""
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM, PreTrainedTokenizerFast

    log = json.loads((training.SHIPPED / training.LOG).read_text())
    assert log["files"] == training.shipped_hashes(training.SHIPPED)
    target = Gemma4ForCausalLM.from_pretrained(training.SHIPPED / training.TARGET, dtype=torch.float32).eval()
    drafter = Gemma4AssistantForCausalLM.from_pretrained(training.SHIPPED / training.DRAFTER,
                                                         dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=str(training.SHIPPED / training.TARGET / "tokenizer.json"))
    assert tok.vocab_size == log["vocab_size"] == target.config.vocab_size
    _, held_docs, source = training.corpus_documents(log["recipe"])
    if source["sha256"] != log["corpus"]["sha256"]:
        pytest.skip(f"this Python's standard library ({source['python']}) is not the corpus the pair was trained "
                    f"on ({log['corpus']['python']}): the files load; the loss is not comparable")
    from tokenizers import Tokenizer

    held = training.token_stream(Tokenizer.from_file(str(training.SHIPPED / training.TARGET / "tokenizer.json")),
                                 held_docs)
    windows = training._eval_windows(held, log["recipe"]["seq_len"])
    with torch.no_grad():
        loss = float(training._target_loss(target, windows))
        _, agree = training.draft_losses(target, drafter, windows[:4], log["recipe"]["drafter"]["unrolled_steps"])
    assert abs(loss - log["target_eval_loss"]) < 0.05, (loss, log["target_eval_loss"])
    assert min(float(a) for a in agree) > 0.2, agree  # chance is 1 in 4,096
