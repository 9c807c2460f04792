"""Models: plain nn.Modules with no distributed code (the default GPT). Imports nothing from disttrain."""
