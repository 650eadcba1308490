"""Pulumi program entry point (the language host runs this file): see ascend_pd/program.py."""

from ascend_pd.program import main

main()
