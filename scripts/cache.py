"""Same as the installed ``superbpe-cache`` command: python scripts/cache.py list|verify|clear"""

from superbpe.commands import cache

if __name__ == "__main__":
    cache()
