"""Same as the installed ``superbpe-evaluate`` command (kept for running from a checkout).

python scripts/evaluate.py tokenizer=outputs/DATE/TIME input=heldout.txt
"""

from superbpe.commands import evaluate

if __name__ == "__main__":
    evaluate()
