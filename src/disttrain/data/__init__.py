"""Data: the bundled text corpus, the character tokenizer, the resumable global-position batch loader and
moving batches to a device. May import config, errors and utils only."""
