"""The verdict in words, as the console prints it and the report keeps it (`words`): the decision
at each load with its interval, the break-even loads, and what each speedup goal not met would
need. It reads the verdict's JSON (draftline/benchmark/verdict.py), keys as the report has them.
"""

from __future__ import annotations


def interval_words(d: dict) -> str:
    """A decision's speedup with its interval ("<speedup>x [<low>-<high>]"), or the point and why
    it has no interval."""
    if d["speedup"] is None:
        return "no speedup measured"
    if d["low"] is None:
        return f"{d['speedup']:.2f}x (one pass: no interval)"
    return f"{d['speedup']:.2f}x [{d['low']:.2f}-{d['high']:.2f}]"


def load_words(c: int, d: dict) -> str:
    """The decision at one load in a sentence."""
    at = f"at {c} request{'s' if c != 1 else ''} in flight"
    others = ", ".join(f"k={o}" for o in d.get("not_settled_against", []))
    tied = (
        f"; {others} not yet told within or beyond the k margin of it (more rounds could move k)"
        if others
        else ""
    )
    if d["decision"] == "yes":
        return f"{at} it pays off: k={d['k']} gives {interval_words(d)}{tied}"
    if d["decision"] == "no":
        return f"{at} it does not pay off: even k={d['best_k']} gives {interval_words(d)}"
    if d["decision"] == "no_gain":
        return (
            f"{at} there is no gain worth deploying: every k lies below 1 or within "
            f"{d.get('margin', 0):.0%} of it (k={d['best_k']}: {interval_words(d)})"
        )
    if d["low"] is None:
        return (
            f"{at} it cannot be told: k={d['k']} gives {d['speedup']:.2f}x from one pass per "
            "server, no spread to judge by"
        )
    more = (
        f"; about {d['rounds_to_decide']} rounds of passes at this spread would decide it"
        if d.get("rounds_to_decide")
        else "; more passes at this spread would not decide it"
    )
    return (
        f"{at} it cannot be told: k={d['k']} gives {interval_words(d)}, which holds 1{tied}{more}"
    )


def verdict_words(v: dict) -> str:
    """The verdict in a few sentences, as the console prints it."""
    c = v["serve_concurrency"]
    decided = v["decisions"]
    conf = f"{v['confidence']:.0%}"
    layout = (v.get("design") or {}).get("layout")
    text = (
        f"{v['engine']}{f' ({layout})' if layout else ''}, intervals at {conf} shared by every k "
        f"and pair of ks at every load and look: {load_words(c, decided[str(c)])}."
    )
    rest = [load_words(int(other), d) for other, d in decided.items() if int(other) != c]
    if rest:
        text += " " + "; ".join(rest)[0].upper() + "; ".join(rest)[1:] + "."
    be = v["break_even"]
    if be["break_even_concurrency"]:
        text += (
            f" Break-even near {be['break_even_concurrency']:g} requests in flight: serve without "
            f"speculation above it."
        )
    if (beyond := be.get("model_estimate")) and beyond.get("concurrency"):
        text += (
            f" The cost model puts break-even near {beyond['concurrency']:g} requests in flight"
            + (" (extrapolated past the loads measured)." if beyond["extrapolated"] else ".")
        )
    if be["undecided_at"] or be.get("no_gain_at"):
        text += (
            f" Deployed with k={v['undecided_k']} where undecided or no gain worth deploying "
            f"({sorted(be['undecided_at'] + be.get('no_gain_at', []))} requests in flight)."
        )
    if v.get("k_per_batch_size_covers"):
        text += f" The k schedule was {v['k_per_batch_size_covers']}."
    for goal, need in v.get("needs", {}).items():
        if need.get("met"):
            continue
        if need.get("acceptance_length") is None:
            text += (
                f" No draft reaches {goal}x at this load with k <= {need['max_k']}: verifying "
                "costs more than k + 1 tokens a step can repay."
            )
        else:
            text += (
                f" {goal}x needs an acceptance length of {need['acceptance_length']} at "
                f"k={need['k']} (measured {need['measured_acceptance_length']})"
            )
            forecast = need.get("forecast")
            if forecast and forecast.get("samples"):
                at = (
                    f"; {forecast['acceptance_length']} at k={forecast['k']}, where the forecast's "
                    "points were measured"
                    if forecast["k"] != need["k"]
                    else ""
                )
                text += (
                    f"{at}, which the samples forecast puts at about {forecast['samples']:,} "
                    f"training samples ({forecast['trust']})."
                )
            elif forecast and forecast.get("why_not"):
                text += f"; samples: {forecast['why_not']}."
            else:
                text += "."
    if v.get("engine_bound"):
        text += " " + v["engine_bound"]
    return text
