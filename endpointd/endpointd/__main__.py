"""Allow `python -m endpointd`, which works even where the console script is not on PATH."""

from endpointd.cli import main

if __name__ == "__main__":
    main()
