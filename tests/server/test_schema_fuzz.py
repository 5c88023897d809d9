"""Schema fuzz: schemathesis generates requests for every operation of /openapi.json (valid ones
and ones that break the schema) and checks each answer against the document: no 5xx, documented
status codes, content types and headers, bodies matching their schemas, schema-breaking requests
refused and schema-valid ones accepted unless the server states a limit the schema cannot express
(see `SEMANTIC_CODES`). Every request has a timeout (a hang fails) and /health must stay 200.

The server runs the bundled model with a 64-token context, so no generated request can make it
compute for long. Examples per operation: SGJIT_FUZZ_EXAMPLES (50 here; the long run uses 500).
A failure prints the case as a curl command."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import CheckContext
from schemathesis.specs.openapi.checks import positive_data_acceptance

from sgjit.server.app import create_app
from sgjit.server.args import ServerArgs
from tests.server_harness import LiveServer

EXAMPLES = int(os.environ.get("SGJIT_FUZZ_EXAMPLES", "50"))
REQUEST_TIMEOUT_S = 60.0  # generous on a slow shared CPU: only a hang gets near it
API_KEY = "fuzz-key"

# 400s a schema-valid request may still get: limits that depend on the model, the tokenizer, the
# server's configuration or the content of free-form fields, which JSON schema cannot state.
SEMANTIC_CODES = frozenset(
    {
        "context_length_exceeded",  # prompt + output longer than the model's context
        "capacity_exceeded",  # more sequences or tokens than the KV cache holds
        "invalid_grammar",  # a regex / JSON schema the constrained decoder cannot compile
        "conflicting_parameters",  # fields valid alone but not together (the document states each alone)
        "unsupported_by_model",  # e.g. suffix on a model without fill-in-the-middle tokens
        "token_out_of_vocabulary",  # a token id (logit_bias, stop_token_ids) past this model's vocabulary
        "invalid_program",  # a plan whose JSON is not a GraphPlan, or run arguments it does not take
        "profiling_disabled",  # server started without --profile-dir
    }
)
# Fields whose content the schema leaves open (free-form dicts checked by the runtime).
FREE_FORM_PARAMS = ("sampling_params", "defaults", "prompt", "input_ids", "text", "messages")


@pytest.fixture(scope="module")
def fuzz_server():
    import sgjit

    rt = sgjit.Runtime(device="cpu", max_total_tokens=2048, max_model_len=64, seed=0)
    server = LiveServer(rt, api_key=API_KEY)
    yield server
    server.stop()
    rt.shutdown()


# The document does not depend on the model, so it is read from an app without one (at import:
# schemathesis parametrizes at collection time); the cases are sent to the live server.
schema = schemathesis.openapi.from_dict(create_app(ServerArgs(port=0)).openapi())
schema.config.generation.update(modes=["positive", "negative"])


@schemathesis.check
def schema_valid_accepted(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """positive_data_acceptance, except for 400s naming a limit the schema cannot express."""
    if case.meta is None or not case.meta.generation.mode.is_positive or response.status_code != 400:
        return positive_data_acceptance(ctx, response, case)
    error = response.json().get("error", {})
    param = error.get("param") or ""
    if error.get("code") in SEMANTIC_CODES or param.split(".")[0] in FREE_FORM_PARAMS:
        return None
    return positive_data_acceptance(ctx, response, case)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,  # the same examples here as in CI's clean clone
    phases=[Phase.explicit, Phase.generate],  # no shrinking: CI-sized; the curl shows the case as sent
    suppress_health_check=list(HealthCheck),
)
def test_schema_fuzz(case, fuzz_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    try:
        case.call_and_validate(
            base_url=fuzz_server.url,
            headers=headers,
            timeout=REQUEST_TIMEOUT_S,
            excluded_checks=[positive_data_acceptance],
            additional_checks=[schema_valid_accepted],
        )
    except Exception as e:
        if "Timeout" in type(e).__name__ or "timed out" in str(e):
            pytest.fail(f"no answer within {REQUEST_TIMEOUT_S} s:\n{case.as_curl_command(headers)}")
        raise
    health = httpx.get(fuzz_server.url + "/health", timeout=REQUEST_TIMEOUT_S)
    assert health.status_code == 200, f"/health {health.status_code} after:\n{case.as_curl_command(headers)}"
