"""`python -m tfdet` is the `tfdet` command."""

from tfdet._cli import run_main

if __name__ == "__main__":
    run_main()
