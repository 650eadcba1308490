"""The proxy key every suite deploys with (ascend-pd:proxy.auth, the secret ascend-pd:proxyApiKey) and
what a client sends with it. status, heal and the exporter read it from $ASCEND_PD_PROXY_API_KEY, as
an operator exports it; the suites that start a proxy set it in their own environment."""

from __future__ import annotations

import os

from ascend_pd.secrets import PROXY_KEY_ENV

TEST_PROXY_KEY = "apd-test-key-3f9c1e7a5b2d4068"
AUTH = {"Authorization": f"Bearer {TEST_PROXY_KEY}"}


def export() -> None:
    """$ASCEND_PD_PROXY_API_KEY for status, heal and the exporter run in this process."""
    os.environ[PROXY_KEY_ENV] = TEST_PROXY_KEY
