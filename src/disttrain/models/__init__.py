"""Models: plain nn.Modules with no distributed code (the default GPT)."""
