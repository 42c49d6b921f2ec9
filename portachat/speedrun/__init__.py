"""`portachat speedrun`: tokenizer -> base -> mid -> SFT -> RL -> evals -> report.md, resumable."""
