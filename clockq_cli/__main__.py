"""`python -m clockq_cli`: the same as the `clockq` console script."""

from clockq_cli.main import main

main()
