"""Rendering conversations with the target's chat template and masking the assistant's tokens.
The prompt a server builds from messages and tools becomes token ids here too (chat_prompt_ids).

The loss mask marks exactly the tokens the assistant generated: its reasoning, content, tool
calls and its end-of-turn token. Everything else (system, user, tool results, the role header
the template writes before each turn, text the template adds after end-of-turn) is 0.

Where each assistant turn i starts and ends is read off the template itself:
  prompt_i = render(messages[:i], add_generation_prompt=True)   what the server sent the model
  upto_i   = render(messages[:i+1])                             the turn closed by the template
The turn's generated text is upto_i[len(prompt_i):], cut after its end-of-turn token.

Templates that rewrite earlier turns (Qwen3 drops the reasoning of turns before the last user
message) make upto_i disagree with the render of the whole conversation. So a conversation becomes
one or more rows: a row is the render up to some assistant turn j, and it trains every turn i <= j
whose upto_i[:end_i] is a prefix of it, i.e. whose context and text appear in the row exactly as
the target saw and produced them. Turns left over start the next row (taken from the latest one
backwards). A prefix-stable template gives one row per conversation; Qwen3 gives one per user
message whose answer carried reasoning. Each row is then what the target saw at serving time, so
its hidden states are the ones the draft will get. (One row per assistant turn, as speculators'
prepare-data does, is also exact but repeats every context once per turn.)

Tokens are made per segment (context / generated text), not by tokenizing the row at once and
mapping character offsets: the server tokenized the prompt on its own and the model produced the
turn's tokens after it, so the boundary never falls inside a token and decoding the masked tokens
gives back exactly the assistant text. Where that differs from tokenizing the row at once (a
tokenizer that merges across the boundary or adds a prefix space per call), the row is tokenized
at once and the difference is counted (tokenize_row).

Many rows are tokenized at once (tokenize_rows): every segment of every row in one batched call,
and the row at once only where the segments could differ from it. For a byte-level BPE with the
GPT-2 split pattern (tiny target, SmolLM2, GPT-2 family) that is decided without tokenizing the
row again (segments_join_exactly); any other tokenizer gets both tokenizations, as tokenize_row does.

Re-tokenizing the text need not give the tokens the target generated (a model can emit a sequence
its tokenizer merges otherwise; a parser can reformat a tool call). Where regenerate recorded the
server's own ids for a turn (ServerTurn), each turn's trained tokens are compared with them
(check_turn), and on request the ids replace the turn's tokens in the row (splice_runs).
"""

from __future__ import annotations

import json
import re
import weakref
from bisect import bisect_left, bisect_right
from dataclasses import dataclass


class TemplateMismatch(ValueError):
    """The template renders a conversation so that a turn's boundaries cannot be derived."""


@dataclass(frozen=True)
class Turn:
    index: int  # position in messages
    upto: str  # render(messages[:index+1])
    start: int  # first character the assistant generated
    end: int  # one past its end-of-turn token
    # the generation prompt pre-filled text the closed turn renders otherwise: the span starts
    # inside what the server sent, so the server's ids cannot stand in for it
    prefilled: bool = False


def normalize_messages(messages: list[dict]) -> list[dict]:
    """The messages as an OpenAI-compatible server hands them to the template.

    vLLM parses tool-call arguments given as JSON strings into dicts before rendering (templates
    expect mappings); `reasoning` and `reasoning_content` name the same field in different servers.
    """
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant":
            if m.get("reasoning") and not m.get("reasoning_content"):
                m["reasoning_content"] = m["reasoning"]
            if m.get("tool_calls"):
                m["tool_calls"] = [_parsed_call(tc) for tc in m["tool_calls"]]
            elif "tool_calls" in m:
                m.pop("tool_calls")  # an empty list would send templates down the tool-call path
        out.append(m)
    return out


def _parsed_call(tool_call: dict) -> dict:
    fn = dict(tool_call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            parsed = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            fn["arguments"] = parsed
    return {**tool_call, "function": fn}


def render(
    tokenizer,
    messages: list[dict],
    tools,
    add_generation_prompt: bool = False,
    template_kwargs: dict | None = None,
) -> str:
    """The template's text; template_kwargs (enable_thinking...) must be those the server got."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **(template_kwargs or {}),
    )


def chat_prompt_ids(
    tokenizer, messages: list[dict], tools, chat_template_kwargs: dict
) -> list[int]:
    """Token ids of the prompt the server builds: the chat template with the generation prompt,
    encoded without extra special tokens (as vLLM, SGLang and transformers serve do)."""
    text = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=True,
        **chat_template_kwargs,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def first_turn_prompt(row: dict) -> list[dict]:
    """The messages before the first assistant turn: what the model is asked to answer."""
    prompt = []
    for m in row["messages"]:
        if m["role"] == "assistant":
            break
        prompt.append(m)
    return prompt


def first_turn_ids(tokenizer, row: dict) -> list[int]:
    """Token ids of a row's first-turn prompt (its tools included), as a server builds them."""
    return chat_prompt_ids(tokenizer, first_turn_prompt(row), row.get("tools"), {})


def mark_length_cut(messages: list[dict], finish_reasons: list[str] | None) -> list[dict]:
    """Copy finish reasons (one per assistant turn, in order, as regeneration records them) onto
    the assistant messages, so a turn cut by max_tokens is known to have no end-of-turn token."""
    if not finish_reasons:
        return messages
    reasons = iter(finish_reasons)
    return [
        {**m, "finish_reason": next(reasons, None)} if m.get("role") == "assistant" else m
        for m in messages
    ]


def end_of_turn_tokens(tokenizer, generation_eos_ids=None) -> list[str]:
    """Token strings that end a generated turn: the tokenizer's eos and the generation config's
    eos ids (Llama 3.1 stops on <|eot_id|> and <|eom_id|>)."""
    ids = generation_eos_ids if isinstance(generation_eos_ids, list) else [generation_eos_ids]
    names = [tokenizer.eos_token] + [
        tokenizer.convert_ids_to_tokens(i) for i in ids if i is not None
    ]
    return sorted({n for n in names if n}, key=len, reverse=True)


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def assistant_turns(
    tokenizer, messages: list[dict], tools, stops: list[str], template_kwargs: dict | None = None
) -> list[Turn]:
    """The character span of every assistant turn in the render that closes it.

    An assistant message at position 0 has no prompt to answer and stays context. A turn cut by
    max_tokens (``finish_reason: "length"`` on the message) trains its text but not the
    end-of-turn token the template appends: the target did not produce one.
    """
    turns = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i == 0:
            continue
        prompt = render(tokenizer, messages[:i], tools, True, template_kwargs)
        upto = render(tokenizer, messages[: i + 1], tools, False, template_kwargs)
        prefilled = not upto.startswith(prompt)
        if not prefilled:
            start = len(prompt)
        else:
            # The generation prompt pre-fills text the closed turn renders differently (an empty
            # <think></think> scaffold vs recorded reasoning): the model generated from where the
            # two part, valid only while the history itself renders the same.
            history = render(tokenizer, messages[:i], tools, False, template_kwargs)
            start = _common_prefix_len(prompt, upto)
            if not upto.startswith(history) or start < len(history):
                raise TemplateMismatch(
                    f"message {i}: prompt and closed-turn renders differ inside the history"
                )
        body = upto[start:]
        cut = max((body.rfind(s) + len(s) for s in stops if s in body), default=-1)
        end = start + cut if cut != -1 else len(upto)
        if m.get("finish_reason") == "length" and cut != -1:
            stop = next(s for s in stops if body[:cut].endswith(s))
            end -= len(stop)
        if end <= start:
            raise TemplateMismatch(
                f"message {i}: the template renders no text for this assistant turn"
            )
        turns.append(Turn(i, upto, start, end, prefilled))
    return turns


def plan_rows(turns: list[Turn]) -> list[tuple[int, str, list[Turn]]]:
    """[(messages rendered, row text, [each trained turn])] in conversation order."""
    rows = []
    remaining = list(turns)
    while remaining:
        last = remaining[-1]
        covered = [t for t in remaining if last.upto.startswith(t.upto[: t.end])]
        rows.append((last.index + 1, last.upto, covered))
        remaining = [t for t in remaining if t not in covered]
    rows.reverse()
    return rows


def segments(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, bool]]:
    """Split text into (piece, generated) at the span boundaries; the tail after the last turn is
    dropped (nothing to train on, and the next user message is no part of this row)."""
    out, pos = [], 0
    for start, end in sorted(spans):
        if start > pos:
            out.append((text[pos:start], False))
        out.append((text[start:end], True))
        pos = end
    return out


def tokenize_segments(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    input_ids, loss_mask = [], []
    for piece, generated in pieces:
        ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
        input_ids += ids
        loss_mask += [int(generated)] * len(ids)
    return input_ids, loss_mask


def trained_runs(input_ids: list[int], loss_mask: list[int]) -> list[list[int]]:
    """The ids of each run of masked tokens, in order: one run per trained turn (turns are never
    adjacent, the template writes a header between two)."""
    runs, previous = [], 0
    for token, masked in zip(input_ids, loss_mask):
        if masked and not previous:
            runs.append([])
        if masked:
            runs[-1].append(token)
        previous = masked
    return runs


def tokenize_row(
    tokenizer, text: str, spans: list[tuple[int, int]]
) -> tuple[list[int], list[int], bool]:
    """(input_ids, loss_mask, whole): segment-wise tokens when they equal the row tokenized at once
    (byte-level BPE with special tokens at the turn boundaries: Llama 3, Qwen, ...). A tokenizer
    that merges across a boundary or prefixes every call (SentencePiece's "▁") gets the row
    tokenized at once instead, tokens masked when they overlap a turn (`whole` = True)."""
    input_ids, loss_mask = tokenize_segments(tokenizer, segments(text, spans))
    row_text = text[: max(end for _, end in spans)]
    try:
        enc = tokenizer(row_text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:  # a slow tokenizer has no offsets: keep the segments
        return input_ids, loss_mask, False
    if enc["input_ids"] == input_ids:
        return input_ids, loss_mask, False
    mask = [
        int(any(start < e and end > s for s, e in spans)) for start, end in enc["offset_mapping"]
    ]
    return list(enc["input_ids"]), mask, True


# ---- many rows at once ------------------------------------------------------------------------

# The split pattern of pre_tokenizers.ByteLevel(use_regex=True) (tokenizers' byte_level.rs): every
# alternative is a run of one character class, or a whitespace run with one character of
# lookahead, and none looks behind. So a split found at position b of a piece is there whatever
# follows b two characters on (whitespace runs aside, which the window check below extends over),
# and the piece scanned from b on splits as the text after b scanned alone.
JOIN_WINDOW = 16  # characters after a boundary that decide the split at it
JOIN_MAX_LEFT = 512  # longer text before a boundary inside a piece: tokenize the row at once


@dataclass(frozen=True)
class SegmentJoin:
    """What segments_join_exactly needs of a tokenizer that qualifies (see join_rule)."""

    added: re.Pattern | None  # the added tokens, longest first (leftmost-longest, as tokenizers)
    pre_tokenize: object  # the backend's pre_tokenize_str
    memo: dict  # text before a boundary -> its pre-tokens (the role headers repeat)


_JOIN_RULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def join_rule(tokenizer) -> SegmentJoin | None:
    """The rule that tells from the text alone that a row's segments tokenize as the row does, for a
    tokenizer with no normalizer, a ByteLevel(use_regex=True, add_prefix_space=False)
    pre-tokenizer, a BPE model without dropout, and added tokens that strip nothing and all match
    on the raw text alike; None for any other (its rows are tokenized at once as well)."""
    try:
        return _JOIN_RULES[tokenizer]
    except (KeyError, TypeError):
        pass
    # tokenizers loads on first use: rendering needs only the tokenizer it is given
    from tokenizers import models, pre_tokenizers

    rule = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    if (
        backend is not None
        and backend.normalizer is None
        and backend.truncation is None
        and backend.padding is None
        and not getattr(backend, "encode_special_tokens", False)
        and isinstance(pre, pre_tokenizers.ByteLevel)
        and pre.use_regex
        and not pre.add_prefix_space
        and isinstance(backend.model, models.BPE)
        and backend.model.dropout is None
    ):
        added = list(backend.get_added_tokens_decoder().values())
        plain = all(not (t.lstrip or t.rstrip or t.single_word) for t in added)
        if plain and len({t.normalized for t in added}) <= 1:
            contents = sorted({t.content for t in added if t.content}, key=len, reverse=True)
            pattern = re.compile("|".join(map(re.escape, contents))) if contents else None
            rule = SegmentJoin(pattern, pre.pre_tokenize_str, {})
    try:
        _JOIN_RULES[tokenizer] = rule
    except TypeError:  # not weak-referenceable: decided again next time
        pass
    return rule


def _pre_tokens(rule: SegmentJoin, text: str) -> list[tuple[int, int]]:
    found = rule.memo.get(text)
    if found is None:
        if len(rule.memo) > 4096:
            rule.memo.clear()
        found = rule.memo[text] = [span for _, span in rule.pre_tokenize(text)]
    return found


def segments_join_exactly(rule: SegmentJoin, text: str, bounds: list[int]) -> bool:
    """True when tokenizing text[:b1], text[b1:b2], ... one call each gives the ids of text
    tokenized at once (False: not shown, tokenize the row to know).

    The tokenizer first cuts the text at its added tokens and tokenizes each piece between them
    on its own: a boundary at the edge of an added token changes nothing, one inside an added
    token always does. A boundary b inside a piece that starts at p (the piece's start, or the
    boundary before b in it) joins exactly when the piece, pre-tokenized from p, splits at b and
    splits text[p:b] as text[p:b] alone splits: past b the scan restarts at b either way, and BPE
    merges within a pre-token only."""
    matches = [m.span() for m in rule.added.finditer(text)] if rule.added is not None else []
    starts = [s for s, _ in matches]
    ends = [e for _, e in matches]
    previous = 0
    for b in bounds:
        k = bisect_right(starts, b - 1)  # matches starting before b
        if k and ends[k - 1] > b:
            return False  # an added token across the boundary
        piece_start = ends[k - 1] if k else 0
        piece_end = starts[k] if k < len(starts) else len(text)
        if b in (piece_start, piece_end):
            previous = b
            continue
        p = max(piece_start, previous)
        if b - p > JOIN_MAX_LEFT:
            return False
        w = min(piece_end, b + JOIN_WINDOW)
        while w < piece_end and text[w - 1].isspace():  # a whitespace run decides at its end
            w = min(piece_end, w + JOIN_WINDOW)
        window = [(s + p, e + p) for s, e in _pre_tokens(rule, text[p:w])]
        cut = bisect_left([e for _, e in window], b)
        if cut == len(window) or window[cut][1] != b:
            return False  # no split at b
        if [(s - p, e - p) for s, e in window[: cut + 1]] != _pre_tokens(rule, text[p:b]):
            return False
        previous = b
    return True


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids without special tokens added, as `tokenizer(text, add_special_tokens=False)`
    gives them, in one batched call."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def tokenize_rows(
    tokenizer, rows: list[tuple[str, list[tuple[int, int]]]]
) -> list[tuple[list[int], list[int], bool, list[list[int]]]]:
    """tokenize_row of each (text, spans), and the trained runs of each (trained_runs), for many
    rows at once: every segment of every row in one batched call; the rows whose segments may
    tokenize otherwise than the row (segments_join_exactly) tokenized at once in a second."""
    if not getattr(tokenizer, "is_fast", False):
        out = []
        for text, spans in rows:
            ids, mask, whole = tokenize_row(tokenizer, text, spans)
            out.append((ids, mask, whole, trained_runs(ids, mask)))
        return out
    rule = join_rule(tokenizer)
    pieces = [segments(text, spans) for text, spans in rows]
    encoded = iter(encode_texts(tokenizer, [piece for row in pieces for piece, _ in row]))
    out, recheck = [], []
    for k, ((text, _), row) in enumerate(zip(rows, pieces)):
        input_ids, loss_mask, runs, bounds, at, last_masked = [], [], [], [], 0, 0
        for piece, generated in row:
            ids = next(encoded)
            if at:
                bounds.append(at)
            at += len(piece)
            if generated and ids:
                if last_masked:
                    runs[-1].extend(ids)
                else:
                    runs.append(list(ids))
            input_ids += ids
            loss_mask += [int(generated)] * len(ids)
            if ids:
                last_masked = int(generated)
        out.append((input_ids, loss_mask, False, runs))
        if rule is None or not segments_join_exactly(rule, text[:at], bounds):
            recheck.append(k)
    if recheck:
        texts = [rows[k][0][: max(end for _, end in rows[k][1])] for k in recheck]
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        for k, ids, offsets in zip(recheck, enc["input_ids"], enc["offset_mapping"]):
            if ids == out[k][0]:
                continue
            spans = rows[k][1]
            mask = [int(any(start < e and end > s for s, e in spans)) for start, end in offsets]
            out[k] = (list(ids), mask, True, trained_runs(ids, mask))
    return out


# ---- the server's own token ids ---------------------------------------------------------------


@dataclass(frozen=True)
class ServerTurn:
    """What the server said of one assistant turn (regenerate records it per turn)."""

    token_ids: list[int] | None  # everything the model generated; None: the server returned none
    completion_tokens: int | None  # its usage.completion_tokens; None: it sent none


def server_span(
    tokenizer, ids: list[int], rendered: str, stops: list[str], cut_by_length: bool
) -> list[int]:
    """The server's ids as the turn's trained tokens. vLLM and the hf server return the end-of-turn
    token they stopped on; a server that leaves it out gets the one the template renders
    (`rendered` is the turn's span, which ends with it unless the turn was cut by max_tokens)."""
    if cut_by_length or not ids:
        return list(ids)
    stop_ids = {tokenizer.convert_tokens_to_ids(s) for s in stops}
    if ids[-1] in stop_ids:
        return list(ids)
    stop = next((s for s in stops if rendered.endswith(s)), None)
    return list(ids) + ([tokenizer.convert_tokens_to_ids(stop)] if stop else [])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two id lists differ (the shorter one's length when one is a
    prefix of the other), None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_turn(
    retokenized: list[int], server: ServerTurn | None, spliced: list[int] | None, turn: Turn
) -> dict:
    """One assistant turn's re-tokenized span against what the server said: its ids (`spliced`:
    them as trained, the end-of-turn token completed by server_span) and its usage count."""
    usage = server.completion_tokens if server else None
    check = {
        "message": turn.index,
        "server_ids": spliced is not None,
        "retokenized_tokens": len(retokenized),
        "usage_completion_tokens": usage,
        "prefilled": turn.prefilled,
    }
    if spliced is not None:
        at = first_difference(retokenized, spliced)
        check["server_tokens"] = len(server.token_ids)
        check["equal"] = at is None
        check["end_of_turn_added"] = len(spliced) > len(server.token_ids)
        if at is not None:  # a few ids either side of the first difference, to show in the report
            check["first_difference"] = at
            check["retokenized_around"] = retokenized[max(0, at - 4) : at + 4]
            check["server_around"] = spliced[max(0, at - 4) : at + 4]
    return check


def splice_runs(
    input_ids: list[int], loss_mask: list[int], replacements: list[list[int] | None]
) -> tuple[list[int], list[int]]:
    """The row with its k-th run of trained tokens replaced by replacements[k] (None: kept), the
    tokens around each run as they were."""
    out_ids, out_mask, run, previous = [], [], -1, 0
    for token, masked in zip(input_ids, loss_mask):
        if masked and not previous:
            run += 1
            if replacements[run] is not None:
                out_ids += replacements[run]
                out_mask += [1] * len(replacements[run])
        if not (masked and replacements[run] is not None):
            out_ids.append(token)
            out_mask.append(masked)
        previous = masked
    return out_ids, out_mask


@dataclass(frozen=True)
class ConversationPlan:
    """A conversation rendered and cut into rows, before any token: plan_conversation."""

    messages: list[dict]  # normalized (normalize_messages), finish reasons marked
    stops: list[str]
    rows: list[tuple[int, str, list[Turn]]]  # plan_rows

    def row_spans(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """(text, spans) of each row, as tokenize_rows takes them."""
        return [(text, [(t.start, t.end) for t in turns]) for _, text, turns in self.rows]


def plan_conversation(
    tokenizer,
    messages: list[dict],
    tools,
    stops: list[str] | None = None,
    template_kwargs: dict | None = None,
) -> ConversationPlan:
    """The renders and rows of one conversation (TemplateMismatch, or the template's own error,
    when it cannot be cut into turns)."""
    messages = normalize_messages(messages)
    stops = stops if stops is not None else end_of_turn_tokens(tokenizer)
    turns = assistant_turns(tokenizer, messages, tools, stops, template_kwargs)
    return ConversationPlan(messages, stops, plan_rows(turns))


def conversation_rows(
    tokenizer,
    plan: ConversationPlan,
    tokenized: list[tuple[list[int], list[int], bool, list[list[int]]]],
    max_length: int,
    server_turns: list[ServerTurn | None] | None = None,
    use_server_ids: bool = False,
) -> list[dict]:
    """The rows of one conversation from its plan and its rows' tokenize_rows (as
    tokenize_conversation gives them).

    server_turns: what the server said of each assistant message, in order (regenerate's record).
    Each turn's re-tokenized span (the tokens it trains on when re-tokenized) is compared with
    them; with use_server_ids the server's ids replace the turn's tokens in the row, between the
    template's own tokens (the header before the turn and what follows its end-of-turn stay as
    tokenized). A turn without server ids, or whose span starts inside a pre-filled generation
    prompt, keeps its re-tokenized span.

    Each row is cut to max_length tokens after that (its tail is lost; the caller drops rows left
    with no trainable token)."""
    messages, stops = plan.messages, plan.stops
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    said = dict(zip(assistant, server_turns or []))
    rows = []
    for (n_messages, text, turns), (input_ids, loss_mask, whole, runs) in zip(plan.rows, tokenized):
        separate = len(runs) == len(turns)  # the header between two turns keeps their runs apart
        if not separate:  # never seen; then compare each turn's text alone, and splice nothing
            runs = [
                tokenizer(text[t.start : t.end], add_special_tokens=False)["input_ids"]
                for t in turns
            ]
        spliced, checks = [], []
        for turn, retokenized in zip(turns, runs):
            server = said.get(turn.index)
            ids = None
            if server is not None and server.token_ids is not None:
                ids = server_span(
                    tokenizer,
                    server.token_ids,
                    text[turn.start : turn.end],
                    stops,
                    messages[turn.index].get("finish_reason") == "length",
                )
            checks.append(check_turn(retokenized, server, ids, turn))
            spliced.append(None if turn.prefilled or not separate else ids)
        if use_server_ids and any(ids is not None for ids in spliced):
            input_ids, loss_mask = splice_runs(input_ids, loss_mask, spliced)
        for check, ids in zip(checks, spliced):
            check["spliced"] = use_server_ids and ids is not None
        cut = len(input_ids) > max_length
        rows.append(
            {
                "input_ids": input_ids[:max_length] if cut else input_ids,
                "loss_mask": loss_mask[:max_length] if cut else loss_mask,
                "truncated": cut,
                "length": len(input_ids),
                "turns": len(turns),
                "messages": n_messages,
                "whole": whole,
                "checks": checks,
            }
        )
    return rows


def tokenize_conversation(
    tokenizer,
    messages: list[dict],
    tools,
    max_length: int,
    stops: list[str] | None = None,
    template_kwargs: dict | None = None,
) -> list[dict]:
    """Rows for one conversation: [{"input_ids", "loss_mask", "truncated", "length", "turns",
    "messages", "whole", "checks"}] (`length`: tokens before the cut; `turns`: assistant turns it
    trains; `messages`: how many messages it renders; `whole`: see tokenize_row; `checks`:
    check_turn of each turn it trains), without the server's token ids (conversation_rows takes
    them). Many conversations at once: plan_conversation of each, one tokenize_rows over all
    their rows, then conversation_rows of each.
    """
    plan = plan_conversation(tokenizer, messages, tools, stops, template_kwargs)
    return conversation_rows(
        tokenizer, plan, tokenize_rows(tokenizer, plan.row_spans()), max_length
    )
