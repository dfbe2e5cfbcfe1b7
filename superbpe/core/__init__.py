"""The ground floor: what a tokenizer is (types, errors, byte table, pre-tokenizers, rules, counts,
compat presets, vocabulary layout) and how text is read; imports nothing else of the package."""
