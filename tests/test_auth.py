"""API keys on the server: parsing, the bearer check, and which routes the middleware guards (a bare
app with the server's routes' paths; the real server with the openai client is in test_server.py)."""

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from specserve.errors import SpecserveError
from specserve.server.auth import api_keys, install_auth, valid


def test_keys_from_the_command_line_and_the_environment():
    assert api_keys(None, {}) == ()
    assert api_keys(["a1"], {"SPECSERVE_API_KEY": "b2, c3,,a1"}) == ("a1", "b2", "c3")   # de-duplicated, in order
    with pytest.raises(SpecserveError, match="empty"):
        api_keys([""], {})
    with pytest.raises(SpecserveError, match="whitespace"):
        api_keys(["a b"], {})


def test_bearer_check_by_hand():
    keys = ("sk-one", "sk-two")
    assert valid("Bearer sk-one", keys) and valid("bearer sk-two", keys) and valid("Bearer  sk-two ", keys)
    assert not valid(None, keys) and not valid("", keys) and not valid("sk-one", keys)
    assert not valid("Basic sk-one", keys) and not valid("Bearer sk-on", keys) and not valid("Bearer sk-one2", keys)


def app(keys, metrics_public=False) -> TestClient:
    a = FastAPI()
    for path in ("/v1/models", "/v1/chat/completions", "/health", "/metrics"):
        a.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
    install_auth(a, keys, metrics_public)
    return TestClient(a)


def test_v1_and_metrics_need_a_key_health_does_not():
    c = app(("sk-one", "sk-two"))
    r = c.get("/v1/models")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "invalid_request_error" and "API key" in r.json()["error"]["message"]
    assert c.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-bad"}).status_code == 401
    assert c.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-two"}).status_code == 200
    assert c.get("/v1/models", headers={"Authorization": "Bearer sk-one"}).status_code == 200
    assert c.get("/health").status_code == 200
    assert c.get("/metrics").status_code == 401
    assert c.get("/metrics", headers={"Authorization": "Bearer sk-one"}).status_code == 200
    assert app(("sk-one",), metrics_public=True).get("/metrics").status_code == 200


def test_no_keys_no_authentication():
    c = app(())
    assert c.get("/v1/models").status_code == 200 and c.get("/metrics").status_code == 200
