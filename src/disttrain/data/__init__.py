"""Data: the bundled text corpus, the character tokenizer and the resumable global-position batch loader."""
