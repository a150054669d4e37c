import sys


def build():
    return None


sys.exit(0)
