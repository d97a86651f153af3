"""What every phase shares: the target card (the contract between phases), file helpers, the CPU
thread policy."""
