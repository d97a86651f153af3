"""Run by the vLLM environment's Python: vLLM's own SpeculativeConfig built from a deployment
command's --speculative-config for a target, as `vllm serve` builds it before it loads any weight
(the method resolved from the draft's config, the speculators reader's fields, the checks vLLM
makes). Takes a JSON list of jobs (one vLLM import for all) and prints what vLLM resolved for each
as one JSON list; a config vLLM refuses gives {"error": its own error} in its place."""

import json
import sys


def main() -> None:
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    def resolve(job: dict) -> dict:
        target = ModelConfig(model=job["model"], dtype="float32")
        spec = SpeculativeConfig(
            **job["speculative_config"],
            target_model_config=target,
            target_parallel_config=ParallelConfig(),
        )
        hf = spec.draft_model_config.hf_config
        return {
            "method": spec.method,
            "parallel_drafting": bool(spec.parallel_drafting),
            "num_speculative_tokens": spec.num_speculative_tokens,
            "architectures": list(getattr(hf, "architectures", None) or []),
            "eagle_aux_hidden_state_layer_ids": list(
                getattr(hf, "eagle_aux_hidden_state_layer_ids", None) or []
            ),
            "dflash_config": getattr(hf, "dflash_config", None),
            "pard_token": getattr(hf, "pard_token", None),
        }

    def resolved_or_refused(job: dict) -> dict:
        try:
            return resolve(job)
        except Exception as refused:  # whatever vLLM raises is its answer
            return {"error": f"{type(refused).__name__}: {refused}"}

    print(json.dumps([resolved_or_refused(job) for job in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
