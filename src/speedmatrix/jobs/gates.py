"""Quality gates (seed 003): does the server still answer correctly, beside how fast it answers.

Each gate sends real chat requests to the running server and returns a
verdict with its evidence (finish reasons, what failed and why). A gate
never raises for a wrong answer: a failure is a result, shown in the report.

- ``smoke``: one short question; passes on a non-empty answer that ended by
  itself (finish_reason ``stop``; ``length`` is a failure, as in seed 003's
  256-token attempt).
- ``structured_json``: the answer under a JSON schema (``response_format``);
  passes when it parses and validates.
- ``tool_calls``: N requests offering one tool; passes when every one calls
  it with arguments that parse and hold the required key.

The schema and the tool bound their strings and numbers (a city name of at
most 64 characters, a population below 10^10): a server's structured output
(a grammar) then holds any model's answer to a finite JSON document, and the
structured JSON gate tests that the grammar path works end to end; what the
answer says is the model's. A gate set ``expect: fail`` (a model that was
never trained to answer questions or call tools) still runs; its verdict
says whether it went as expected (``as_expected``), and the report shows a
failure it expected as such, not as a regression.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..core import atomic, http
from ..core.settings import section_defaults
from ..measure import client
from .job import JobContext

SMOKE_PROMPT = "Reply with one short sentence: what is the capital of France?"
JSON_PROMPT = ("Describe the city of Paris as a JSON object with the keys name (a string), country (a string) "
               "and population (an integer). Answer with the JSON object only.")
JSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 64},
                   "country": {"type": "string", "minLength": 1, "maxLength": 64},
                   "population": {"type": "integer", "minimum": 0, "maximum": 10**10}},
    "required": ["name", "country", "population"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 64}},
                       "required": ["city"]},
    },
}
TOOL_CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul", "Dakar", "Hanoi"]


def _chat(url: str, model: str, headers: dict[str, str], body: dict[str, Any], timeout: float) -> dict[str, Any]:
    resp = http.post_json(f"{url}/v1/chat/completions", {"model": model, "temperature": 0.0, **body},
                          headers=headers, timeout=timeout)
    if resp.status != 200:
        return {"error": f"HTTP {resp.status}: {resp.text[:300]}"}
    return resp.json()


def _choice(answer: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    choice = (answer.get("choices") or [{}])[0]
    return choice.get("message") or {}, choice.get("finish_reason")


def smoke(url, model, headers, settings, chat_kwargs, timeout) -> dict[str, Any]:
    answer = _chat(url, model, headers, {"messages": [{"role": "user", "content": SMOKE_PROMPT}],
                                         "max_tokens": settings["max_tokens"], **chat_kwargs}, timeout)
    if "error" in answer:
        return {"passed": False, "reason": answer["error"]}
    msg, finish = _choice(answer)
    content = (msg.get("content") or "").strip()
    reason = None
    if not content:
        reason = "empty answer"
    elif finish != "stop":
        reason = f"finish_reason={finish} (the answer did not end within max_tokens)"
    return {"passed": reason is None, "reason": reason, "finish_reason": finish, "answer": content[:500],
            "completion_tokens": (answer.get("usage") or {}).get("completion_tokens")}


def structured_json(url, model, headers, settings, chat_kwargs, timeout) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": JSON_PROMPT}], "max_tokens": settings["max_tokens"],
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": JSON_SCHEMA}},
            **chat_kwargs}
    answer = _chat(url, model, headers, body, timeout)
    if "error" in answer:
        return {"passed": False, "reason": answer["error"]}
    msg, finish = _choice(answer)
    content = (msg.get("content") or "").strip()
    try:
        jsonschema.validate(json.loads(content), JSON_SCHEMA)
        reason = None if finish == "stop" else f"finish_reason={finish}"
    except ValueError as exc:
        reason = f"not JSON: {exc}"
    except jsonschema.ValidationError as exc:
        reason = f"JSON not of the schema: {exc.message}"
    return {"passed": reason is None, "reason": reason, "finish_reason": finish, "answer": content[:500]}


def tool_calls(url, model, headers, settings, chat_kwargs, timeout) -> dict[str, Any]:
    count = int(settings["count"])
    ok, failures = 0, []
    for i in range(count):
        city = TOOL_CITIES[i % len(TOOL_CITIES)]
        body = {"messages": [{"role": "user", "content": f"What is the weather in {city} right now? Use the tool."}],
                "tools": [TOOL], "tool_choice": settings["tool_choice"],
                "max_tokens": settings["max_tokens"], **chat_kwargs}
        answer = _chat(url, model, headers, body, timeout)
        if "error" in answer:
            failures.append({"request": i, "reason": answer["error"]})
            continue
        msg, finish = _choice(answer)
        calls = msg.get("tool_calls") or []
        try:
            if not calls:
                raise ValueError(f"no tool call (finish_reason={finish})")
            fn = calls[0].get("function") or {}
            if fn.get("name") != TOOL["function"]["name"]:
                raise ValueError(f"called {fn.get('name')!r}")
            args = json.loads(fn.get("arguments") or "")
            if not isinstance(args, dict) or not isinstance(args.get("city"), str):
                raise ValueError(f"arguments without a city: {str(args)[:100]}")
            ok += 1
        except ValueError as exc:
            failures.append({"request": i, "reason": str(exc)[:300]})
    return {"passed": ok == count, "reason": None if ok == count else f"{ok}/{count} tool calls valid",
            "valid": ok, "count": count, "failures": failures[:10]}


@dataclass(frozen=True)
class Gate:
    label: str  # the report's column
    check: Callable[..., dict[str, Any]]


# the gates, in the report's order: the one list of their names (the schema's ``gates`` block has a key for each:
# tests/test_config.py)
GATES = {"smoke": Gate("Smoke", smoke), "structured_json": Gate("Structured JSON", structured_json),
         "tool_calls": Gate("Tool calls", tool_calls)}


def run(gate: str, url: str, model: str, headers: dict[str, str], settings: dict[str, Any],
        chat_template_kwargs: dict[str, Any] | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """One gate against a running server: its verdict, never an exception for a wrong answer."""
    chat_kwargs = {"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {}
    func = GATES[gate].check
    settings = section_defaults("gates", {gate: settings})[gate]  # the schema's defaults for what is not given
    t0 = time.monotonic()
    try:
        verdict = func(url, model, headers, settings, chat_kwargs, timeout)
    except (OSError, ValueError) as exc:  # no answer, or one that is not JSON
        verdict = {"passed": False, "reason": f"request failed: {type(exc).__name__}: {exc}"[:300]}
    return {"gate": gate, **verdict, "expect": settings["expect"],
            "as_expected": verdict["passed"] == (settings["expect"] == "pass"), "settings": settings,
            "chat_template_kwargs": chat_template_kwargs, "seconds": round(time.monotonic() - t0, 3)}


def run_rule(job: JobContext, gate: str, out_json: str) -> dict[str, Any]:
    """The gate rule: acquire the server config's server (starting it if needed), run the gate, write its verdict."""
    exp = job.experiment
    job.use_api_key()
    settings = exp.raw["gates"][gate]
    with job.server() as info:
        print(f"gate {gate} on {job.server_id} at {info['url']} with {settings}")
        verdict = run(gate, info["url"], job.launch["served_model_name"], client.auth_headers(), settings,
                      exp.client.chat_template_kwargs)
        startup = info["startup"]
    doc = {"experiment": exp.name, "server_id": job.server_id, **verdict, "provenance": job.provenance(startup)}
    atomic.write_json(out_json, doc)
    said = "passed" if verdict["passed"] else "FAILED: " + str(verdict.get("reason"))
    print(f"gate {gate}: {said}" + ("" if verdict["as_expected"] else f" (expected to {verdict['expect']})")
          + (f" (expected: {settings.get('because')})" if verdict["expect"] == "fail" else ""))
    return doc
