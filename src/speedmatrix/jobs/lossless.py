"""The losslessness check's two jobs: a speculative config's outputs, then its twin's outputs and the scores.

``outputs_rule`` runs on the speculative config's server: for each sampling setting its cells use, the check's
prompts one request at a time (request i seeded seed + i where sampled, as a cell sends them), each output's
token ids kept, the speculative acceptance over them from the server's counters. ``verdict_rule`` runs on the
twin's server (the same model and arguments without speculation): the same prompts and settings, then the
emitted tokens of both scored by the target (``prompt_logprobs`` over the prompt's and the output's ids: every
token of a sampled setting; of a greedy one, only outputs that differ), and the verdict per setting
(speedmatrix.judge.lossless). One request at a time: a batch's numerics are the engine's business, and the loss
this check exists for showed at one request at a time on vLLM for the CPU.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..core import atomic, http
from ..core.errors import CellError
from ..judge import lossless as verdicts
from ..measure import client, metrics, prompts
from .job import JobContext

NONCE = "lossless"  # the same prompts on both servers, in every run


async def _generate(url: str, model: str, ids: list[list[int]], sampling: dict[str, Any],
                    max_tokens: int) -> list[list[int]]:
    opts = client.RequestOptions(max_tokens=max_tokens, usage_per_chunk=False, watch_loops=False,
                                 temperature=float(sampling.get("temperature", 0.0)), top_p=sampling.get("top_p"),
                                 seed=sampling.get("seed"), frequency_penalty=sampling.get("frequency_penalty"),
                                 return_token_ids=True)
    _, records = await client.fixed_count(url, model, lambda i: ids[i], len(ids), 1, opts, phase="lossless")
    failed = [r for r in records if r.error]
    if failed:
        raise CellError(f"{len(failed)} of {len(records)} requests of the losslessness check failed at {url}: "
                        f"{failed[0].error}")
    if any(r.output_tokens and not r.output_ids for r in records):
        raise CellError(f"{url} returned no token ids (return_token_ids): the check compares outputs token by token "
                        "and needs a vLLM that sends them")
    return [list(r.output_ids) for r in records]


async def _generate_all(url: str, model: str, settings: list[str], check: dict[str, Any],
                        progress) -> dict[str, Any]:
    async with client.control_session() as session:
        source = await prompts.from_server(session, url, model, seed=0, kind=check["corpus"], nonce=NONCE,
                                           headers=client.auth_headers())
        ids = [source.prompt(i, int(check["context_tokens"])) for i in range(int(check["prompts"]))]
        out = {}
        for key in settings:
            sampling = verdicts.sampling_of(key)
            before = await client.scrape(session, url)  # the server's counters ({} without /metrics)
            outputs = await _generate(url, model, ids, sampling, int(check["max_tokens"]))
            after = await client.scrape(session, url)
            acceptance = (metrics.delta(metrics.snapshot(before), metrics.snapshot(after))
                          .get("spec_decode_acceptance_rate") if before else None)
            progress(f"{verdicts.label(sampling)}: {len(outputs)} requests, {sum(map(len, outputs)):,} tokens"
                     + (f", acceptance {acceptance:.1%}" if acceptance is not None else ""))
            out[key] = {"sampling": sampling, "outputs": outputs, "acceptance": acceptance}
    return {"prompts": ids, "settings": out}


def generate(url: str, model: str, settings: list[str], check: dict[str, Any],
             progress=print) -> dict[str, Any]:
    """Every setting's outputs (and the acceptance over them) for the check's prompts on one server."""
    return asyncio.run(_generate_all(url, model, settings, check, progress))


def score(url: str, model: str, prompt: list[int], output: list[int]) -> list[float]:
    """The target's log-probability of each output token after the prompt and the output before it."""
    if not output:
        return []
    body = {"model": model, "prompt": prompt + output, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    resp = http.post_json(f"{url}/v1/completions", body, headers=client.auth_headers(), timeout=120)
    if resp.status != 200:
        raise CellError(f"{url}/v1/completions answered HTTP {resp.status} to prompt_logprobs: {resp.text[:300]}")
    entries = resp.json()["choices"][0].get("prompt_logprobs")
    if not entries:
        raise CellError(f"{url} returned no prompt_logprobs: the check scores tokens with them")
    return [float(entries[len(prompt) + k][str(t)]["logprob"]) for k, t in enumerate(output)]


def outputs_rule(job: JobContext, settings: list[str], check: dict[str, Any], out_json: str) -> dict[str, Any]:
    """On a speculative config's server: its outputs for every sampling setting of its cells."""
    job.use_api_key()
    with job.server() as info:
        print(f"losslessness check of {job.server_id}: {check['prompts']} prompts of {check['context_tokens']} "
              f"tokens, {check['max_tokens']} tokens out, one at a time, {len(settings)} setting(s)")
        made = generate(info["url"], job.launch["served_model_name"], settings, check)
        startup = info["startup"]
    doc = {"experiment": job.experiment_name, "server_id": job.server_id, "check": check, **made,
           "provenance": job.provenance(startup)}
    atomic.write_json(out_json, doc)
    return doc


def verdict_rule(job: JobContext, spec_outputs: str, check: dict[str, Any], out_json: str) -> dict[str, Any]:
    """On the twin's server: its own outputs for the same prompts and settings, every token of both scored, the
    verdict per setting."""
    theirs = atomic.read_json(spec_outputs)
    job.use_api_key()
    model = job.launch["served_model_name"]
    with job.server() as info:
        url = info["url"]
        print(f"losslessness check of {theirs['server_id']} against {job.server_id} (its twin)")
        ours = generate(url, model, list(theirs["settings"]), check)
        if ours["prompts"] != theirs["prompts"]:
            raise CellError(f"the twin {job.server_id} tokenizes the check's prompts differently from "
                            f"{theirs['server_id']}: they do not serve the same target")
        judged = []
        for key, spec in theirs["settings"].items():
            twin = ours["settings"][key]
            need = set(verdicts.to_score(spec["sampling"], spec["outputs"], twin["outputs"]))
            spec_scores = [score(url, model, p, o) if i in need else []
                           for i, (p, o) in enumerate(zip(theirs["prompts"], spec["outputs"]))]
            twin_scores = [score(url, model, p, o) if i in need else []
                           for i, (p, o) in enumerate(zip(ours["prompts"], twin["outputs"]))]
            v = verdicts.judge(spec["sampling"], spec["outputs"], twin["outputs"], spec_scores, twin_scores, check)
            v["acceptance"] = spec["acceptance"]
            print(f"{v['label']}: {v['verdict']}: {v['reason']}")
            judged.append(v)
        startup = info["startup"]
    doc = {"experiment": job.experiment_name, "server_id": theirs["server_id"], "twin": job.server_id,
           "check": check, "settings": judged, "outputs_of": spec_outputs, "provenance": job.provenance(startup),
           "config_provenance": theirs["provenance"]}
    atomic.write_json(out_json, doc)
    return doc
