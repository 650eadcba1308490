"""Pulumi program entry point (the language host runs this file): see ascend_pd/program.py."""

from ascend_pd.program import exit_quietly_when_cancelled, main

exit_quietly_when_cancelled()
main()
