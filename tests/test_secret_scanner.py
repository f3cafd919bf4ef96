"""The one secret scanner: each known format and high-entropy token is found; ordinary values are not."""

from __future__ import annotations

import hashlib
import random
import string
from pathlib import Path

import pytest

from perfgate.evidence import Ledger
from perfgate.execution.request import CommandRequest, redact_request
from perfgate.security.envredactor import Redactor, placeholder, redact_env_values, request_secrets
from perfgate.security.scrubber import Scrubber
from perfgate.security.secretscan import find_secrets, random_like, value_secrets

FOUND = {
    "aws-access-key-id": "id AKIAIOSFODNN7EXAMPLE here",
    "aws-secret-key": "--foo wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github-token": "push ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "gitlab-token": "glpat-xK3m9Qw2Lr7Zt5Vb8NcY",
    "slack-token": "xoxb-2048-4096-AbCdEfGhIjKlMnOp",
    "openai-key": "OPENAI sk-proj-Xq9Lr2Vt8Wn4Zp6Ks1Jd3Fh5Gm7Bc0Nx",
    "anthropic-key": "sk-ant-api03-Xq9Lr2Vt8Wn4Zp6Ks1Jd3Fh5Gm7Bc0Nx",
    "google-api-key": "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI",
    "huggingface-token": "hf_QmVhZ3lZb3VyVG9rZW5Jc05vdFJlYWwx",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "private-key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "url-password": "s3://reader:hunter2pass@bucket/data",
    "assignment": 'db_password = "abc12345"',
    "bearer": "Authorization: Bearer abcdefghijklmnop.qrstuvwx",
    "high-entropy": "loaded Xq7vR2mK9pLw4NzT8bYc3HdF in a log line",
}


@pytest.mark.parametrize("kind", sorted(FOUND))
def test_each_known_format_is_found_with_its_kind(kind: str) -> None:
    assert kind in {f.kind for f in find_secrets(FOUND[kind])}


ORDINARY = [
    "/usr/lib/python3.11/site-packages/torch/nn/modules/TransformerEncoderLayer.py",
    "--lr 3e-4 --model gpt2-medium --out runs/llama-7b-lr3e-4-bs32",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "LlamaForCausalLM_TransformerEncoderLayer2",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
    "triton__0d1d2d3d4d5d6d",
    "XK_XF86_MonBrightnessUp PyModuleDef_HEAD_INIT",
    "commit 9361faed751eeb2a5f9c2ab27a251b1d2cd91e20 sha256 " + hashlib.sha256(b"x").hexdigest(),
    "run 550e8400-e29b-41d4-a716-446655440000 on node gpu-node-17",
    "ev-20250101T120000-1a2b3c4d exp-20250101T120000-1a2b3c",
    "step 100 | loss 2.3456 | 123.4 ms | tokens_per_step=524288",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_values_are_not_secrets(text: str) -> None:
    assert find_secrets(text) == []
    assert Scrubber().text(text) == text


@pytest.mark.parametrize("value", ["3e-4", "gpt2-medium", "/data/runs/exp1", "0,1,2,3", "8", "bf16", "eth0"])
def test_ordinary_request_values_survive_the_value_rules(value: str) -> None:
    assert value_secrets(value) == ()
    assert Scrubber.for_values({"X": value}, ["--x", value]).argv(["--x", value]) == ["--x", value]


def test_perfgate_ids_and_digests_are_never_secrets() -> None:
    for _ in range(200):
        eid = Ledger.new_id()
        assert find_secrets(eid) == [], eid


def test_random_mixed_case_tokens_are_found_nearly_always() -> None:
    """The stated rule's recall on random base62 tokens of 20 to 64 characters (seeded)."""
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits
    tokens = ["".join(rng.choice(alphabet) for _ in range(rng.randint(20, 64))) for _ in range(1000)]
    assert sum(random_like(t) for t in tokens) >= 900


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("5f0c2e9a7b1d4c3e8f6a0b2d4e6f8a1c3e5d7b9f", "hex-token"),  # a hex key under an ordinary name
        ("k3j5h2l9m8n7b6v5c4x3z2q1", "high-entropy"),  # single case, letters and digits
        ("/opt/lib:/tmp/Tn5kW8qZr2Lm7XpB:/usr/lib", "high-entropy"),  # 16 characters, nested in a list
    ],
)
def test_request_values_are_read_more_strictly(value: str, kind: str) -> None:
    assert kind in {k for k, _ in value_secrets(value)}
    assert find_secrets(value) == [] or kind == "high-entropy"


def test_a_hex_file_name_in_a_path_is_not_a_value_secret() -> None:
    blob = "/cache/hub/models--gpt2/blobs/" + hashlib.sha256(b"w").hexdigest()
    assert value_secrets(blob) == () and value_secrets("ckpt-" + "ab12" * 10 + ".pt") == ()


def test_the_same_secret_gets_the_same_placeholder_and_another_secret_another() -> None:
    a = redact_env_values({"MY_SETTING": "Xq7vR2mK9pLw4NzT8bYc3HdF"})
    b = redact_env_values({"MY_SETTING": "Xq7vR2mK9pLw4NzT8bYc3HdF"})
    c = redact_env_values({"MY_SETTING": "Pq7vR2mK9pLw4NzT8bYc3HdF"})
    assert a == b != c and a["MY_SETTING"].startswith("<redacted:high-entropy:")
    assert placeholder("named", "x") != placeholder("named", "y")


def test_scrubbing_twice_changes_nothing_more() -> None:
    """A placeholder is never scrubbed again, not even by a secret that reads 'redacted'."""
    scrub = Scrubber({"MY_PASSWORD": "redacted"})
    text = "--key=Vb3nM8kQ2wZr6TpL9xYc4HfJ password=redacted wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    once = scrub.text(text)
    assert "Vb3nM8kQ" not in once and "wJalr" not in once
    assert scrub.text(once) == once and Redactor({}).text(once) == once


def test_the_approval_binds_the_real_values_while_the_stored_request_holds_none() -> None:
    secret = "Gh6pD2sW9kLm4RzX7bNv3QcT"
    request = CommandRequest(
        argv=("python", "train.py", secret, "--key=" + secret), cwd=Path("/w"), env={"A": secret}, timeout_s=5
    )
    other = request.model_copy(update={"env": {"A": "Zh6pD2sW9kLm4RzX7bNv3QcT"}})
    assert request.digest != other.digest  # bound over the real values
    shown = redact_request(request)
    assert secret not in shown.model_dump_json() and secret not in shown.describe("t")
    assert shown.argv[2] == shown.argv[3].removeprefix("--key=") == shown.env["A"]  # one secret, one tag
    assert list(request_secrets(request.env, request.argv)) == [secret]
