"""Run by the vLLM environment's Python: vLLM's own SpeculativeConfig built from a deployment
command's --speculative-config for a target, as `vllm serve` builds it before it loads any weight
(the method resolved from the draft's config, the speculators reader's fields, the checks vLLM
makes). Prints what vLLM resolved as JSON; a config vLLM refuses raises its own error."""

import json
import sys


def main() -> None:
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    job = json.loads(sys.argv[1])
    target = ModelConfig(model=job["model"], dtype="float32")
    spec = SpeculativeConfig(
        **job["speculative_config"],
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
    )
    hf = spec.draft_model_config.hf_config
    print(
        json.dumps(
            {
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
        )
    )


if __name__ == "__main__":
    main()
