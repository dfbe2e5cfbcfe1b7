"""Same as the installed ``superbpe-train`` command (kept for running from a checkout).

python scripts/train.py                                      # default job, embedded corpus
python scripts/train.py schedule=superbpe schedule.transition=0.8 data.paths=[corpus.txt]
python scripts/train.py -m vocab_size=8000,16000 schedule=superbpe schedule.transition=0.5,0.8
"""

from superbpe.commands import train

if __name__ == "__main__":
    train()
