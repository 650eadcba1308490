"""Pulumi program entry point (the language host runs this file): see ascend_pd/program.py."""

from ascend_pd.program import exit_quietly_when_cancelled, main, without_full_collections

exit_quietly_when_cancelled()
without_full_collections()
main()
