"""The EAGLE-3 aux layer rule: which decoder layers' inputs the draft is fed (the target, the
hidden_states capture and a train.init checkpoint all read it)."""


# ---- the EAGLE-3 aux layer ids and the device a choice resolves to ------------------------------


def eagle3_default_aux_ids(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def resolve_aux_layer_ids(explicit: list[int] | None, num_layers: int) -> list[int]:
    """Explicit ids, or the EAGLE-3 rule; either must be 3 distinct ids in [0, num_layers]."""
    ids = list(explicit) if explicit is not None else eagle3_default_aux_ids(num_layers)
    origin = "target.aux_layer_ids" if explicit is not None else f"the EAGLE-3 default {ids}"
    if len(ids) != 3:
        raise ValueError(f"{origin}: EAGLE-3 needs exactly 3 aux layer ids, got {ids}")
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) > num_layers:
        hint = "" if explicit is not None else "; set target.aux_layer_ids explicitly"
        raise ValueError(
            f"{origin}: ids must be distinct and within [0, {num_layers}] for a target with "
            f"{num_layers} layers, got {ids}{hint}"
        )
    return sorted(ids)
