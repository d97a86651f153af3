"""Target hidden states in speculators' file layout.

One file per tokenized row i: hs_{i}.safetensors with
  token_ids      [L]        the row's input_ids
  hidden_states  [L, 4, H]  the inputs of the 3 aux decoder layers, then the last decoder layer's
                            output *before* the final norm (speculators applies the target's norm
                            itself to `verifier_last_hidden_states`)

Aux id i is the residual stream entering decoder layer i (0 = embeddings, N = the final pre-norm
output), which is what vLLM hands an EAGLE-3 draft: its Llama model appends `hidden_states +
residual` for aux layer idx just before calling layer idx (vllm/model_executor/models/llama.py,
LlamaModel.forward). Backend `hf` reads it with forward pre-hooks on those layers and on the final
norm, so only 4 states per token are ever held; backend `vllm` asks vLLM for ids [a, b, c, N]
(draftline/engines/commands.py).

Files are written to a temp name and renamed, so a killed run never leaves a file that looks
finished; a rerun checks each file (header, shape, dtype, token ids) and redoes only what is
missing or broken. The output directory's meta.json carries a fingerprint of what made the states
(target, aux ids, dtype): a different fingerprint clears the directory instead of mixing states
(the stage decides what it would remove and checks the disk first, then removes it).

Batches are a fixed plan (PLAN_FILE, kept in the directory until the run completes): a resumed
run recomputes each unfinished batch with exactly the rows, order and padding of the run it
resumes, so its files are byte-identical to an uninterrupted run's (padding and batch shape change
the rounding of the stored bf16 values).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftline.core.aux_layers import resolve_aux_layer_ids
from draftline.hidden_states.formats import bytes_per_token, decode, encode

if TYPE_CHECKING:
    from draftline.core.card import TargetCard

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SAFETENSORS_DTYPE = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float8_e4m3fn: "F8_E4M3",
}
SCALES_KEY = (
    "hidden_states_scales"  # hs-connectors' fp8 layout (draftline/hidden_states/formats.py)
)
VLLM_STAGING = ".vllm_staging"  # where vLLM's connector writes inside the output directory
PLAN_FILE = ".extract_plan.json"  # the batches of a run in progress (see extraction_plan)


def hs_path(directory: Path, index: int) -> Path:
    return directory / f"hs_{index}.safetensors"


def check_aux_layer_ids(aux_layer_ids: list[int], num_layers: int) -> list[int]:
    """Re-check the card's ids (it may have been edited) with the rule the target stage applies."""
    return resolve_aux_layer_ids(list(aux_layer_ids), num_layers)


def file_problem(
    path: Path,
    token_ids: list[int],
    hidden_size: int,
    dtype: torch.dtype | None = None,
    full: bool = False,
) -> str | None:
    """Why a row's file is not a finished, uncorrupted file for exactly these tokens (a REDO_REASONS
    key, with what was found), or None when it is.

    Reads the header (a truncated file fails safetensors' own size check), the shape and dtype,
    and the small token_ids tensor; `full` also loads the states and checks they are finite.
    An fp8 file (dtype float8_e4m3fn) also carries its per-token scales [L, 1, 1].
    """
    if not path.exists():
        return "missing"
    fp8 = dtype == torch.float8_e4m3fn
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != {"token_ids", "hidden_states"} | ({SCALES_KEY} if fp8 else set()):
                return f"other_tensors: {sorted(keys)}"
            hs = f.get_slice("hidden_states")
            if list(hs.get_shape()) != [len(token_ids), 4, hidden_size]:
                return (
                    f"other_shape: {list(hs.get_shape())}, not {[len(token_ids), 4, hidden_size]}"
                )
            if dtype is not None and hs.get_dtype() != _SAFETENSORS_DTYPE[dtype]:
                return f"other_dtype: {hs.get_dtype()}"
            if fp8 and list(f.get_slice(SCALES_KEY).get_shape()) != [len(token_ids), 1, 1]:
                return "other_shape: fp8 scales"
            if f.get_tensor("token_ids").tolist() != list(token_ids):
                return "other_tokens: the tokenized row changed"
            if full:
                values = decode(
                    {k: f.get_tensor(k) for k in f.keys() if k != "token_ids"}, torch.float32
                )
                if not bool(torch.isfinite(values).all()):
                    return "not_finite: NaN or inf in the states"
    except Exception as err:  # noqa: BLE001 - any unreadable file is redone, whatever the reader raised
        return f"unreadable: {type(err).__name__}: {str(err)[:160]}"
    return None


def is_valid_file(
    path: Path,
    token_ids: list[int],
    hidden_size: int,
    dtype: torch.dtype | None = None,
    full: bool = False,
) -> bool:
    """A finished, uncorrupted file for exactly these tokens (file_problem finds nothing)."""
    return file_problem(path, token_ids, hidden_size, dtype, full) is None


def estimate_bytes(seq_lens: list[int], hidden_size: int, dtype: torch.dtype) -> int:
    """tokens x the format's true bytes per token: 4 states x H x bytes per value, the int64 token
    id, and the fp8 scale (draftline/hidden_states/formats.py; safetensors headers are negligible)."""
    fmt, name = (
        ("fp8", "bfloat16")
        if dtype == torch.float8_e4m3fn
        else ("bf16", str(dtype).removeprefix("torch."))
    )
    return sum(seq_lens) * bytes_per_token(hidden_size, fmt, name)


def check_disk(directory: Path, needed: int, margin: float, reclaimable: int = 0) -> int:
    """Free bytes at `directory`; raises when they plus `reclaimable` (files the run would remove or
    overwrite) are below needed x margin. Called before anything is removed."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free + reclaimable < needed * margin:
        freed = f" (+ {reclaimable / 1e9:.2f} GB the run would free)" if reclaimable else ""
        raise RuntimeError(
            f"not enough disk for hidden states in {directory}: need {needed / 1e9:.2f} GB "
            f"x margin {margin} = {needed * margin / 1e9:.2f} GB but only {free / 1e9:.2f} GB free{freed} "
            f"(lower hidden_states.disk_margin only if you know the estimate is high); nothing was removed"
        )
    return free


def token_budget_batches(lengths: dict[int, int], budget: int) -> list[list[int]]:
    """Group row indices of similar length so that rows x padded length stays within budget
    (a row longer than the budget goes alone)."""
    order = sorted(lengths, key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if current and longest_if * (len(current) + 1) > budget:
            batches.append(current)
            current, longest_if = [], lengths[i]
        current.append(i)
        longest = longest_if
    if current:
        batches.append(current)
    return batches


def decoder_parts(model):
    """(decoder layers, final norm) of a causal LM, also when the language model sits inside a
    multimodal wrapper (wrapper.language_model -> ForCausalLM -> .model.layers): get_decoder() is
    followed, then `.model`, until a module has both `layers` and `norm`."""
    module = model
    for _ in range(6):
        layers, norm = getattr(module, "layers", None), getattr(module, "norm", None)
        if layers is not None and norm is not None:
            return layers, norm
        inner = module.get_decoder() if hasattr(module, "get_decoder") else None
        if inner is None or inner is module:
            inner = getattr(module, "model", None)
        if inner is None or inner is module:
            break
        module = inner
    raise ValueError(
        f"{type(model).__name__}: cannot find the language model's decoder layers and final norm "
        "(followed get_decoder() and .model to a module with .layers and .norm)"
    )


@torch.no_grad()
def capture(model, input_ids: list[list[int]], aux_layer_ids: list[int]) -> list[torch.Tensor]:
    """[L_b, 4, H] hidden states for each sequence of a right-padded batch."""
    layers, norm = decoder_parts(model)
    device = model.get_input_embeddings().weight.device
    longest = max(len(s) for s in input_ids)
    ids = torch.zeros(len(input_ids), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, seq in enumerate(input_ids):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
    captured: dict = {}

    def grab(key):
        def hook(_module, args, kwargs):
            captured[key] = args[0] if args else kwargs["hidden_states"]

        return hook

    handles = [norm.register_forward_pre_hook(grab("last"), with_kwargs=True)]
    for i in aux_layer_ids:
        module = layers[i] if i < len(layers) else norm  # id N: the final pre-norm output
        handles.append(module.register_forward_pre_hook(grab(i), with_kwargs=True))
    try:
        model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            logits_to_keep=1,
            use_cache=False,
        )
    finally:
        for h in handles:
            h.remove()
    out_device = captured["last"].device  # with a device_map the layers live on several GPUs
    stacked = torch.stack(
        [captured[i].to(out_device) for i in aux_layer_ids] + [captured["last"]], dim=2
    )  # (B, T, 4, H)
    return [stacked[b, : len(seq)] for b, seq in enumerate(input_ids)]


def save_hidden_states(
    path: Path, token_ids: list[int], hidden: torch.Tensor, dtype: torch.dtype
) -> None:
    """Write atomically: a killed run never leaves a file that looks finished."""
    tensors = encode(hidden, dtype)  # fp8: hs-connectors' quantization, with per-token scales
    stored = hidden if dtype == torch.float8_e4m3fn else tensors["hidden_states"]
    if not bool(torch.isfinite(stored).all()):
        raise ValueError(
            f"{path.name}: the target produced non-finite hidden states (overflow in {dtype}?)"
        )
    tmp = path.with_name(path.name + ".tmp")
    save_file({"token_ids": torch.tensor(token_ids, dtype=torch.long), **tensors}, str(tmp))
    os.replace(tmp, path)


def weights_digest(model: str) -> str | None:
    """Size and first/last MiB of each weight file of a local model: changes when it is retrained,
    costs milliseconds even for a terabyte checkpoint. None for a hub id (model + revision name it)."""
    root = Path(model)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(
        p
        for p in root.iterdir()
        if p.suffix in {".safetensors", ".bin", ".pt"} or p.name == "config.json"
    ):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read())
    return h.hexdigest()


def fingerprint(card: TargetCard, dtype_name: str) -> str:
    """What the stored values depend on, besides the tokens each file already records."""
    parts = {
        "model": card.model,
        "revision": card.revision,
        "weights": weights_digest(card.model),
        "num_layers": card.num_layers,
        "hidden_size": card.hidden_size,
        "aux_layer_ids": card.aux_ids,
        "dtype": dtype_name,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def remove_temporaries(out: Path) -> None:
    """Temp files and vLLM staging a killed run left (never outputs: finished files are renamed in)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):
        stale.unlink()
    shutil.rmtree(out / VLLM_STAGING, ignore_errors=True)


def stale_files(out: Path, expected_fingerprint: str) -> list[Path]:
    """The hidden-state files (and batch plan) to clear because another target, aux ids or dtype
    made them; [] when the fingerprint matches or there is nothing. Removes nothing."""
    meta_path = out / "meta.json"
    found = json.loads(meta_path.read_text()).get("fingerprint") if meta_path.exists() else None
    files = sorted(out.glob("hs_*.safetensors"))
    if found == expected_fingerprint or not files:
        return []
    return files + [p for p in [out / PLAN_FILE] if p.exists()]


def prepare_output(out: Path, expected_fingerprint: str) -> int:
    """remove_temporaries, then clear the stale_files at once (no disk check: the stage plans,
    checks, then removes). Returns the number of hidden-state files removed."""
    remove_temporaries(out)
    files = stale_files(out, expected_fingerprint)
    for f in files:
        f.unlink()
    return sum(f.name != PLAN_FILE for f in files)


def extra_files(out: Path, n_rows: int) -> list[Path]:
    """Files of rows past the end of the tokenized data (`samples` shrank)."""
    return sorted(
        f
        for f in out.glob("hs_*.safetensors")
        if not f.stem[3:].isdigit() or int(f.stem[3:]) >= n_rows
    )


def pending_rows(
    rows,
    out: Path,
    hidden_size: int,
    dtype: torch.dtype,
    full_check: bool,
    remove_extra: bool = True,
    redone: dict[str, list[str]] | None = None,
) -> tuple[dict[int, int], int]:
    """({row index: length} of rows whose file is missing or invalid, rows already done).

    `rows` is the tokenized datasets.Dataset; with remove_extra, files of rows past its end
    (samples shrank) are removed (the stage lists them with extra_files and removes them after
    its disk check instead). `redone`, when given, gets the files that exist but are redone, by
    reason (file_problem's key): "hs_12.safetensors: <what was found>".
    """
    todo, done, i = {}, 0, 0
    for batch in rows.with_format(None).iter(batch_size=1024):
        for ids in batch["input_ids"]:
            path = hs_path(out, i)
            problem = file_problem(path, ids, hidden_size, dtype, full_check)
            if problem is None:
                done += 1
            else:
                todo[i] = len(ids)
                if redone is not None and problem != "missing":
                    reason, _, detail = problem.partition(": ")
                    redone.setdefault(reason, []).append(f"{path.name}: {detail or reason}")
            i += 1
    if remove_extra:
        for f in extra_files(out, len(rows)):
            f.unlink()
    return todo, done


def all_rows(rows) -> dict[int, int]:
    """{row index: length} of every row (all of them to do, e.g. after clearing)."""
    lengths, i = {}, 0
    for batch in rows.with_format(None).iter(batch_size=1024):
        for ids in batch["input_ids"]:
            lengths[i] = len(ids)
            i += 1
    return lengths


def _row_digest(ids) -> str:
    return hashlib.blake2b(json.dumps(list(ids)).encode(), digest_size=8).hexdigest()


def extraction_plan(rows, todo: dict[int, int], token_budget: int, out: Path) -> list[list[int]]:
    """The batches to run, fixed for the whole run and saved in out/PLAN_FILE.

    A plan left by a killed run is reused when it was made with the same token_budget for the
    same rows (token digests): its batches keep their exact make-up, so resumed files are
    byte-identical to an uninterrupted run's. Rows it does not cover (samples grew meanwhile) get
    batches of their own. A fresh run plans its `todo` rows by token budget."""
    path, plan = out / PLAN_FILE, None
    if path.exists():
        try:
            saved = json.loads(path.read_text())
            covered = [int(i) for i in saved["rows"]]
            if saved["token_budget"] == token_budget and all(i < len(rows) for i in covered):
                ids = rows.with_format(None).select(covered)["input_ids"] if covered else []
                if all(
                    _row_digest(t) == saved["rows"][str(i)]
                    for i, t in zip(covered, ids, strict=True)
                ):
                    plan = saved
        except (OSError, ValueError, KeyError, TypeError):
            plan = None
    if plan is None:
        plan = {"token_budget": token_budget, "rows": {}, "batches": []}
    uncovered = {i: n for i, n in todo.items() if str(i) not in plan["rows"]}
    if uncovered:
        new = token_budget_batches(uncovered, token_budget)
        ids = rows.with_format(None).select(sorted(uncovered))["input_ids"]
        plan["rows"].update(
            {str(i): _row_digest(t) for i, t in zip(sorted(uncovered), ids, strict=True)}
        )
        plan["batches"] += new
        out.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(plan))
        os.replace(tmp, path)
    return [[int(i) for i in batch] for batch in plan["batches"]]


def extract(
    model,
    rows,
    todo: dict[int, int],
    aux_layer_ids: list[int],
    out: Path,
    dtype: torch.dtype,
    token_budget: int,
    on_batch=None,
) -> int:
    """Capture and write the states of the `todo` rows, by the batches of extraction_plan (every
    row of a batch that has a todo row is run; only todo rows are written). Returns tokens done.
    The plan file is removed once every batch is done."""
    done = 0
    for batch in extraction_plan(rows, todo, token_budget, out):
        wanted = [i for i in batch if i in todo]
        if not wanted:
            continue
        token_ids = rows.with_format(None)[batch]["input_ids"]
        for i, ids, hs in zip(
            batch, token_ids, capture(model, token_ids, aux_layer_ids), strict=True
        ):
            if i in todo:
                save_hidden_states(hs_path(out, i), ids, hs, dtype)
        done += sum(todo[i] for i in wanted)
        if on_batch:
            on_batch(len(wanted), sum(todo[i] for i in wanted))
    (out / PLAN_FILE).unlink(missing_ok=True)
    return done
