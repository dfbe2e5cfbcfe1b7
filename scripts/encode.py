"""Same as the installed ``superbpe-encode`` command (kept for running from a checkout).

python scripts/encode.py tokenizer=outputs/DATE/TIME input=corpus.txt output=corpus.bin
"""

from superbpe.commands import encode

if __name__ == "__main__":
    encode()
