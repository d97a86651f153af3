"""Built-in chain speculative decoding (greedy, batch 1) of an EAGLE-3 draft against its target.

Lossless by construction: every emitted token is the target's own greedy choice; the draft only
decides how many of them one target forward can confirm. Positions, following speculators'
training layout: the draft input at sequence position p is (embedding of token p, target aux
features of position p-1), position id p, and it predicts token p+1.

Round, with context x_0..x_n processed by the target and x_{n+1} its pending greedy token:
  1. draft step 0 over the not-yet-seen positions (inputs x_{j+1}, g_j) -> d_1; steps 1..k-1 feed
     the draft's own token and output state back -> d_2..d_k (one query each, sees everything);
  2. the target verifies [x_{n+1}, d_1..d_k] in one forward; the longest agreeing prefix d_1..d_a
     plus the target's token after it (t_a) are emitted: a+1 tokens for one target forward;
  3. both KV caches are cropped back to what is now fixed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class SpecPair:
    """An EAGLE-3 draft and its target, with the target layers whose hidden states the draft reads
    (the card's aux layer ids): what chain speculative decoding runs."""

    target: object
    draft: object
    aux_layer_ids: list[int]


@dataclass
class Generation:
    tokens: list[int]
    target_forwards: int = 0  # verification forwards (prefill excluded)
    accepted_per_round: list[int] = field(default_factory=list)  # a+1 per round, before any cut
    seconds: float = 0.0
    margins: list[float] = field(
        default_factory=list
    )  # greedy: top-1 minus top-2 logit per token, when asked
    # greedy, with margins: per token, the other tokens within tie_tolerance of the chosen one's
    # logit (always the runner-up) -> how far below it (the near-tie rule: draftline/evaluate/acceptance.py)
    runner_ups: list[dict[int, float]] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        rounds = self.accepted_per_round
        return sum(rounds) / len(rounds) if rounds else 0.0

    @property
    def emitted_per_round(self) -> list[int]:
        """Tokens each round actually added to the output: a+1, except in the last round, which
        loses what lies past eos or max_new_tokens (only the last can: the loop stops there).
        `tokens` also holds the prefill's token, which no round verified."""
        emitted = list(self.accepted_per_round)
        if emitted:
            emitted[-1] -= 1 + sum(emitted) - len(self.tokens)
        return emitted


def _keep_first(cache, n: int) -> None:
    """Crop a KV cache to its first n positions (negative crop = number of positions to drop)."""
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


def _finish(tokens: list[int], eos_ids: set[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Cut at the first eos (kept) or at max_new_tokens; True when generation is over."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos_ids:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


class TargetRunner:
    """Target forward with a KV cache, returning logits and the concatenated aux hidden states."""

    def __init__(self, model, aux_layer_ids: list[int]):
        self.model = model
        self.aux_layer_ids = aux_layer_ids
        self.device = next(model.parameters()).device  # the embeddings' device under a device_map

    @torch.no_grad()
    def forward(self, ids: list[int], cache, want_aux: bool):
        x = torch.tensor([ids], device=self.device)
        out = self.model(
            input_ids=x, past_key_values=cache, use_cache=True, output_hidden_states=want_aux
        )
        aux = (
            torch.cat([out.hidden_states[i].to(self.device) for i in self.aux_layer_ids], dim=-1)
            if want_aux
            else None
        )
        return out.logits[0], aux  # (T, V), (1, T, 3H)


@torch.no_grad()
def greedy_generate(
    target,
    prompt: list[int],
    max_new_tokens: int,
    eos_ids: set[int],
    margins: bool = False,
    tie_tolerance: float = 0.0,
) -> Generation:
    """Plain greedy decoding with a KV cache: the baseline. margins: also record how far each
    chosen token's logit is above the runner-up, and every other token within tie_tolerance of it
    with its distance (untimed uses only: it costs a pass over the logits per token)."""
    start = time.perf_counter()
    runner = TargetRunner(target, [])
    cache = DynamicCache()
    gaps: list[float] = []
    below: list[dict[int, float]] = []

    def choose(logits) -> int:
        choice = int(logits[-1].argmax())
        if margins:
            row = logits[-1].float()
            gap = row[choice] - row  # (V,)
            gap[choice] = float("inf")
            gaps.append(float(gap.min()))
            near = (gap <= max(tie_tolerance, gaps[-1])).nonzero()[:, 0]  # the runner-up at least
            below.append(dict(zip(near.tolist(), gap[near].tolist())))
        return choice

    logits, _ = runner.forward(prompt, cache, want_aux=False)
    tokens = [choose(logits)]
    while True:
        tokens, done = _finish(tokens, eos_ids, max_new_tokens)
        if done:
            break
        logits, _ = runner.forward(tokens[-1:], cache, want_aux=False)
        tokens.append(choose(logits))
    return Generation(
        tokens=tokens,
        target_forwards=len(tokens) - 1,
        seconds=time.perf_counter() - start,
        margins=gaps[: len(tokens)],
        runner_ups=below[: len(tokens)],
    )


class DraftRunner:
    """Incremental inference over speculators' Eagle3DraftModel modules (eager attention)."""

    def __init__(self, draft):
        self.d = draft
        self.device = next(draft.parameters()).device
        self.dtype = draft.fc.weight.dtype
        self.d2t = draft.d2t.to(self.device) if getattr(draft, "d2t", None) is not None else None

    def _to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if self.d2t is not None else draft_ids

    def _project(self, aux: torch.Tensor) -> torch.Tensor:  # (1, q, 3H) -> (1, q, H)
        d = self.d
        if d.input_norm is not None:
            aux = d.input_norm(aux)
        if d.fc_norm is not None:
            aux = torch.cat(
                [n(c) for n, c in zip(d.fc_norm, aux.chunk(len(d.fc_norm), dim=-1), strict=True)],
                dim=-1,
            )
        return d.fc(aux)

    def _layers(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache, mask
    ):
        d = self.d
        x = torch.cat([d.embed_tokens(token_ids), hidden], dim=-1)  # (1, q, 2H)
        position_embeddings = d.rotary_emb(x, positions)
        for layer in d.layers:
            x = layer(
                x,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                position_embeddings=position_embeddings,
            )
        if d.config.norm_output:
            x = d.norm(x)
            return d.lm_head(x), x
        return d.lm_head(d.norm(x)), x

    @torch.no_grad()
    def propose(
        self, cache, next_inputs: list[int], aux: torch.Tensor, first_pos: int, k: int
    ) -> list[int]:
        """Draft k tokens. next_inputs/aux: the new step-0 positions first_pos.. (token j+1, aux j)."""
        q = len(next_inputs)
        aux = aux.to(self.device, self.dtype)  # a 16-bit target's features into the draft's dtype
        past = cache.get_seq_length()
        ids = torch.tensor([next_inputs], device=self.device)
        positions = torch.arange(first_pos + 1, first_pos + 1 + q, device=self.device).unsqueeze(0)
        # causal over the new block, everything already cached is visible
        allowed = torch.ones(q, past + q, dtype=torch.bool, device=self.device)
        allowed[:, past:] = torch.tril(torch.ones(q, q, dtype=torch.bool, device=self.device))
        mask = torch.zeros(1, 1, q, past + q, device=self.device, dtype=aux.dtype).masked_fill(
            ~allowed, float("-inf")
        )
        logits, hidden = self._layers(ids, self._project(aux), positions, cache, mask)
        fixed_len = cache.get_seq_length()
        draft_id = logits[0, -1].argmax()
        proposal = [int(self._to_target_ids(draft_id))]
        hidden, pos = hidden[:, -1:], positions[:, -1:]
        for _ in range(k - 1):
            pos = pos + 1
            ids = torch.tensor([[proposal[-1]]], device=self.device)
            logits, hidden = self._layers(ids, hidden, pos, cache, None)
            proposal.append(int(self._to_target_ids(logits[0, -1].argmax())))
        _keep_first(cache, fixed_len)  # drop the speculative steps; step-0 entries stay valid
        return proposal


@torch.no_grad()
def speculative_generate(
    pair: SpecPair, prompt: list[int], max_new_tokens: int, k: int, eos_ids: set[int]
) -> Generation:
    start = time.perf_counter()
    runner, drafter = TargetRunner(pair.target, pair.aux_layer_ids), DraftRunner(pair.draft)
    t_cache, d_cache = DynamicCache(), DynamicCache()
    logits, aux = runner.forward(prompt, t_cache, want_aux=True)
    seq = list(prompt) + [int(logits[-1].argmax())]  # x_0..x_{n+1}; x_{n+1} pending for the target
    gen = Generation(tokens=[])
    pending_from = 0  # first position whose draft step-0 entry is not yet cached
    while True:
        gen.tokens, done = _finish(seq[len(prompt) :], eos_ids, max_new_tokens)
        if done:
            break
        n = len(seq) - 2  # last position the target has processed
        proposal = drafter.propose(d_cache, seq[pending_from + 1 : n + 2], aux, pending_from, k)
        logits, verify_aux = runner.forward([seq[n + 1]] + proposal, t_cache, want_aux=True)
        target_choice = logits.argmax(dim=-1).tolist()  # token after n+1, after d_1, ...
        a = 0
        while a < k and proposal[a] == target_choice[a]:
            a += 1
        seq.extend(proposal[:a] + [target_choice[a]])
        gen.target_forwards += 1
        gen.accepted_per_round.append(a + 1)
        _keep_first(t_cache, n + 2 + a)  # positions 0..n+1+a are now fixed
        aux = verify_aux[:, : a + 1]  # features of positions n+1..n+1+a
        pending_from = n + 1
    gen.seconds = time.perf_counter() - start
    return gen


@torch.no_grad()
def acceptance_runs(
    pair: SpecPair, prompt: list[int], max_new_tokens: int, k: int, eos_ids: set[int]
) -> tuple[list[int], list[int]]:
    """(greedy output, runs): runs[s] is how many of k draft tokens the target would accept in a
    round that starts with output[:s + 1] fixed (output[s] the pending token), for every s.

    Greedy output is the same whatever k, and a chain draft's proposal from a position depends
    only on the context before it, so these runs give the exact rounds of speculative decoding at
    every k' <= k (walk_rounds), from one pass. The target's greedy continuation is taken k tokens
    past the cut (eos or max_new_tokens): a last round verifies tokens beyond it too."""
    runner, drafter = TargetRunner(pair.target, pair.aux_layer_ids), DraftRunner(pair.draft)
    full = greedy_generate(pair.target, prompt, max_new_tokens + k, set()).tokens
    tokens, _ = _finish(full, eos_ids, max_new_tokens)
    _, aux = runner.forward(list(prompt) + full, DynamicCache(), want_aux=True)  # (1, P+F, 3H)
    seq, cache, runs = list(prompt) + full, DynamicCache(), []
    pending_from = 0  # as in speculative_generate: first position not yet in the draft's cache
    for s in range(len(tokens)):
        n = len(prompt) + s - 1  # last position the target has processed
        proposal = drafter.propose(
            cache, seq[pending_from + 1 : n + 2], aux[:, pending_from : n + 1], pending_from, k
        )
        a = 0
        while a < k and proposal[a] == full[s + 1 + a]:
            a += 1
        runs.append(a)
        pending_from = n + 1
    return tokens, runs


def walk_rounds(runs: list[int], output_length: int, k: int) -> list[int]:
    """The rounds (a+1 each, as Generation.accepted_per_round) of chain speculative decoding at
    k from acceptance_runs' runs: each round starts where the previous one ended."""
    rounds, emitted = [], 1  # the prefill's token
    while emitted < output_length:
        a = min(runs[emitted - 1], k)
        rounds.append(a + 1)
        emitted += a + 1
    return rounds
