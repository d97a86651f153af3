"""The code that shapes each persisted output, and its fingerprint: a resume key's share of code.

Some outputs outlive a rerun of their stage: the hidden-state files, the tokenized rows, the train
loop's resume state, the probe's extraction pass. A rerun keeps them under a key of what made them
(target, params, data...), and that key holds `shaping_fingerprint(<output>)` too: the fingerprint,
without prose (draftline/core/code.py `code_sha256`), of every module in SHAPES[<output>]. So an
edit to what such a module does recomputes the output; a docstring, a comment, or any edit to a
module not listed (a log line, a progress bar, the resume bookkeeping itself) keeps it.

Classifying is per module. A module that mixes shaping code with bookkeeping counts as shaping
(an edit to its log line recomputes: safe, not free); where that cost is large, the shaping code
lives in a module of its own (capture.py, not extract.py; tokens/rows.py, not tokenize.py;
probe/extraction.py, not probe/checks.py). Every module of an output's own phase package that its
stage runs is in SHAPES or in BOOKKEEPING (tests/core/test_shaping.py), so a new module must be
classified.

Left out on purpose: draftline/engines/commands.py for hidden_states and train. It holds every
engine's command line side by side; what the extraction command passes that shapes the states
(the aux ids and N, the dtype, the file or fp8 connector) is in those keys as values, and a file
with other layers or another dtype fails the stage's file check. draftline/tokens/chat.py for the
probe: it renders the probe row, and any short chat prompt probes the same path. Params are in the
keys as values (their defaults included), so the config modules are bookkeeping.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from draftline.core.code import code_sha256

ROOT = Path(__file__).resolve().parents[2]

# per persisted output: the stage that makes it and its phase package (the guard's scope)
OUTPUTS: dict[str, tuple[str, str]] = {
    "regenerate": ("regenerate", "draftline/regenerate/"),
    "hidden_states": ("hidden_states", "draftline/hidden_states/"),
    "tokenize": ("tokenize", "draftline/tokens/"),
    "train": ("train", "draftline/train/"),
    "probe": ("probe", "draftline/probe/"),
}

# every module of the drafters' package, a new method's included without a line here
METHODS = tuple(
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "draftline/draft/methods").glob("*.py"))
)

SHAPES: dict[str, tuple[str, ...]] = {
    # datasets/regenerated/conversations.jsonl: each line's answers (regenerate/settings.py keys
    # every line on this fingerprint with the target's weights and the pins)
    "regenerate": (
        # every assistant turn asked again in order, what each request carries
        "draftline/regenerate/replay.py",
        # the request body: sampling, max_tokens, the chat template's arguments
        "draftline/regenerate/client.py",
        # the streamed answer put together: content, reasoning, tool calls
        "draftline/regenerate/stream.py",
        # the launched server's settings (the batch server's batch size, the engines' flags)
        "draftline/regenerate/launch.py",
        # backend hf: the batch server renders the chat and decodes (loaded by name)
        "draftline/engines/batch_server.py",
        "draftline/engines/greedy_batch.py",
        # how the target is loaded there: dtype, device
        "draftline/targets/model.py",
    ),
    # datasets/hidden_states/hs_*.safetensors (resume.fingerprint)
    "hidden_states": (
        # the forward, the hooks that read the aux layers' inputs and the pre-norm last state, and
        # the dtype the target computes in
        "draftline/hidden_states/capture.py",
        # which rows share a padded forward (a batch's make-up changes the rounding of bf16 states)
        "draftline/hidden_states/batches.py",
        # the stored encoding: the dtype cast, or hs-connectors' fp8 values and scales
        "draftline/hidden_states/formats.py",
        # the file as written: its tensors, their names, the token ids beside the states
        "draftline/hidden_states/files.py",
        # backend vllm on vLLM's CPU build: copies the states out of the KV cache into the files
        # (vLLM loads it by name)
        "draftline/hidden_states/vllm_cpu_connector.py",
        # how the target is loaded: its dtype, device placement, eval mode
        "draftline/targets/model.py",
    ),
    # datasets/tokenized: the rows and shards (tokenize.rows_key)
    "tokenize": (
        # the chat template's rendering, the loss mask, the cut at max_length, the server's ids
        # spliced in: every row's tokens
        "draftline/tokens/chat.py",
        # which conversations give rows, which rows are kept, the fields of a row
        "draftline/tokens/rows.py",
        # the Arrow layout of the rows and the shard files with their token frequencies
        "draftline/tokens/output.py",
    ),
    # models/draft_checkpoints/state.pt (train.resume.run_fingerprint): the builtin loop's state
    "train": (
        # the loop: optimizer, schedule, accumulation, clipping, validation, the best epoch kept,
        # what a checkpoint saves
        "draftline/train/run.py",
        # the split, the packing plan, the packs the loop reads, the online mode's states
        "draftline/train/data.py",
        # seeding, the RNG states saved and restored, state.pt written and read
        "draftline/train/resume.py",
        # the draft built: its shape, its initial weights, what is frozen
        "draftline/draft/model.py",
        # the forward, the batch layout, the precision, the loss
        "draftline/draft/forward.py",
        # each method's classes, forward arguments and metric summary: the registry, the
        # drafters it holds and the imports that register them
        *METHODS,
        # tau_sim, which picks the best epoch whose weights the state holds
        "draftline/draft/metrics.py",
        # train.init's weights loaded and remapped into the draft
        "draftline/draft/pretrained.py",
        # the draft vocabulary and the verifier tensors read into the draft
        "draftline/draft/checkpoint.py",
        # the verifier tensors' names, the target loaded for the online mode
        "draftline/targets/model.py",
        # the online mode's states: captured as the hidden_states stage captures them...
        "draftline/hidden_states/capture.py",
        # ...rounded through the stored format...
        "draftline/hidden_states/formats.py",
        # ...in-process (online.engine hf)...
        "draftline/hidden_states/online.py",
        # ...or by a vLLM extraction server (online.engine vllm)...
        "draftline/hidden_states/online_server.py",
        # ...which on vLLM's CPU build copies them out with this connector (loaded by name)
        "draftline/hidden_states/vllm_cpu_connector.py",
    ),
    # reports/probe.json's extraction pass (probe.checks.extraction_key): whether the configured
    # vLLM path extracts this target
    "probe": (
        # the probe row and how it goes through each path, its file or answer checked
        "draftline/probe/extraction.py",
        # the offline path it runs: the extraction server, speculators' client, the staging
        "draftline/hidden_states/extract.py",
        # the online path's server and its check
        "draftline/hidden_states/online_server.py",
        # the file check the probe row must pass
        "draftline/hidden_states/files.py",
        # the stored dtype the file is checked against
        "draftline/hidden_states/formats.py",
        # vLLM's CPU build writes the probe row's file with it (loaded by name)
        "draftline/hidden_states/vllm_cpu_connector.py",
        # the extraction server's and the client's command lines, the kv-transfer config
        "draftline/engines/commands.py",
        # the probe an endpoint and the online server are checked with, and its HTTP calls
        "draftline/engines/preflight.py",
        "draftline/engines/endpoints.py",
    ),
}

# Modules of an output's phase package that its stage runs and that shape none of its values (a
# module may be bookkeeping for its own phase's output and shape another's: extract.py).
BOOKKEEPING: tuple[str, ...] = (
    # regenerate: the stage's run, its params, the line store (which lines are kept, where the
    # others go), its index, the settings compared, the migration tool, progress lines
    "draftline/regenerate/__init__.py",
    "draftline/regenerate/run.py",
    "draftline/regenerate/config.py",
    "draftline/regenerate/store.py",
    "draftline/regenerate/index.py",
    "draftline/regenerate/settings.py",
    "draftline/regenerate/migrate.py",
    "draftline/regenerate/progress.py",
    # the spot-check of kept conversations: it reads and checks, it writes no line
    "draftline/regenerate/spot_check.py",
    # hidden_states: the stage's run, its params, the disk plan and check, the resume decisions
    "draftline/hidden_states/extract.py",
    "draftline/hidden_states/config.py",
    "draftline/hidden_states/plan.py",
    "draftline/hidden_states/disk.py",
    "draftline/hidden_states/resume.py",
    # the spot-check of kept files: it recomputes and compares, it writes nothing
    "draftline/hidden_states/spot_check.py",
    # tokenize: the streamed, incremental run, its params, the line order and hashes (each
    # conversation's rows are keyed on its line's hash), the previous output kept, the report
    "draftline/tokens/tokenize.py",
    "draftline/tokens/config.py",
    "draftline/tokens/lines.py",
    "draftline/tokens/previous.py",
    "draftline/tokens/report.py",
    # train: params, paths, progress lines and report, and the speculators backend (it keeps its
    # own checkpoints, never state.pt)
    "draftline/train/config.py",
    "draftline/train/paths.py",
    "draftline/train/progress.py",
    "draftline/train/speculators.py",
    # probe: train.init's checks (redone every run), the pass's key and the report
    "draftline/probe/checks.py",
)

CODE_CHANGED = "the code that shapes them changed"  # what a rerun says when that is the reason


def shaping_fingerprint(name: str, root: Path | None = None) -> str:
    """sha256 over the code fingerprint (`code_sha256`: docstrings and comments left out) of each
    module in SHAPES[name], read under `root` (default: this checkout)."""
    base = ROOT if root is None else Path(root)
    h = hashlib.sha256()
    for module in sorted(SHAPES[name]):
        h.update(f"{module}:{code_sha256(base / module)}\n".encode())
    return h.hexdigest()
