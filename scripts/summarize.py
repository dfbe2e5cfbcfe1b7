"""Same as the installed ``superbpe-summarize`` command: python scripts/summarize.py multirun/DATE/TIME"""

from superbpe.commands import summarize

if __name__ == "__main__":
    summarize()
