"""What each vllm-ascend release is particular about, derived from its published sources (the
vllm-ascend and vLLM sdists on PyPI, sha256-pinned in fetch.py), read as source and never imported,
into ascend_pd/data/releases/<release>.json. Run `venv/bin/python -m tools.release_facts` (see
__main__.py); tests/test_release_facts.py holds the files equal to what this derives."""
