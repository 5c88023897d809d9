"""`sgjit.RuntimeEndpoint(url, api_key=None)`: the DSL's HTTP backend. A traced program is registered
with the server once (`POST /plans`) and then run by hash, the whole program on the server; a program
that cannot be traced runs interpreted here, each step a `/generate` call, tokenized with the
server's own tokenizer (fetched once) so both paths feed the model the same tokens."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import tokenizers

from sgjit.errors import InvalidRequestError, ProgramError, SgjitError
from sgjit.lang.backend import GenOutput, GenStep, OnText, ProgramSequence
from sgjit.lang.state import ProgramState
from sgjit.runtime.result import LogprobEntry
from sgjit.runtime.sampling_params import SamplingParams
from sgjit.runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from sgjit.compiler.plan import GraphPlan
    from sgjit.lang.defaults import RunDefaults
    from sgjit.lang.function import Function

log = logging.getLogger(__name__)


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        err = resp.json()["error"]
        message, param = err.get("message", resp.text), err.get("param")
    except (ValueError, KeyError, TypeError):
        message, param = resp.text, None
    if resp.status_code == 400:
        raise InvalidRequestError(f"server rejected the request: {message}", param)
    raise SgjitError(f"server answered {resp.status_code}: {message}")


class FinishedProgram:
    """The sink of a state whose program already ran on the server: its results, read-only."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result

    def read_var(self, name: str) -> Any:
        if name not in self.result["variables"]:
            raise ProgramError(
                f"the program has no variable {name!r}; it has {sorted(self.result['variables'])}"
            )
        return self.result["variables"][name]

    def read_meta(self, name: str) -> Any:
        return self.result["meta_info"].get(name)

    def read_text(self) -> str:
        return self.result["text"]

    def read_messages(self) -> list[dict[str, str]]:
        return self.result.get("messages", [])

    def read_variables(self) -> dict[str, Any]:
        return dict(self.result["variables"])

    def write_var(self, name: str, value: Any) -> None:
        self.result["variables"][name] = value

    def sync(self) -> None:
        pass

    def append(self, node: Any) -> None:
        raise ProgramError("this program ran on the server and has finished; start a new run to add to it")

    fork = join = append


class RemoteSequence:
    """A program sequence on the server. KV residency between steps is the server's prefix cache."""

    def __init__(self, endpoint: RuntimeEndpoint) -> None:
        self.endpoint = endpoint

    def prefill(self, input_ids: list[int]) -> None:
        self.generate(GenStep(input_ids, SamplingParams(max_new_tokens=0)))

    def generate(self, step: GenStep, on_text: OnText | None = None) -> GenOutput:
        body = {"input_ids": step.input_ids, "sampling_params": step.params.to_dict(), **step.logprob_options(),
                "stream": on_text is not None}  # fmt: skip
        client = self.endpoint.http
        if on_text is None:
            resp = client.post("/generate", json=body)
            _raise_for(resp)
            out = resp.json()
            return GenOutput(out["text"], out["meta_info"])
        sent, last = "", None
        with client.stream("POST", "/generate", json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise SgjitError(f"server stream failed: {chunk['error'].get('message')}")
                text = chunk["text"]  # cumulative, as SGLang streams it
                meta = chunk.get("meta_info", {})
                if len(text) > len(sent):
                    on_text(text[len(sent) :], meta)
                    sent = text
                if last is not None and "output_token_logprobs" in meta:  # streamed incrementally
                    meta["output_token_logprobs"] = (
                        last["meta_info"]["output_token_logprobs"] + meta["output_token_logprobs"]
                    )
                    meta["output_top_logprobs"] = (
                        last["meta_info"]["output_top_logprobs"] + meta["output_top_logprobs"]
                    )
                last = chunk
        if last is None:
            raise SgjitError("the server closed the stream without a result")
        return GenOutput(last["text"], last.get("meta_info", {}))

    def score(self, prompts: list[list[int]], starts: list[int]) -> list[list[LogprobEntry]]:
        def one(args: tuple[list[int], int]) -> list[LogprobEntry]:
            ids, start = args
            resp = self.endpoint.http.post("/generate", json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                "logprob_start_len": start})  # fmt: skip
            _raise_for(resp)
            return [tuple(e) for e in resp.json()["meta_info"]["input_token_logprobs"]]

        with ThreadPoolExecutor(max(1, len(prompts))) as pool:  # concurrent: the server batches them
            return list(pool.map(one, zip(prompts, starts)))

    def fork(self) -> ProgramSequence:
        return RemoteSequence(self.endpoint)

    def close(self) -> None:
        pass


class RuntimeEndpoint:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        resp = self.http.get("/tokenizer")
        _raise_for(resp)
        info = resp.json()
        self.tokenizer = Tokenizer(
            tokenizers.Tokenizer.from_str(info["tokenizer_json"]), bos_token_id=info["bos_token_id"],
            eos_token_ids=info["eos_token_ids"], add_bos=info["add_bos"], chat_template=info["chat_template"],
            pad_token_id=info.get("pad_token_id"),
        )  # fmt: skip
        self._functions: dict[str, Function] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.url!r})"

    # ----- the Backend protocol -----
    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def unconditional_prefix(self) -> list[int]:
        tok = self.tokenizer
        return [tok.bos_token_id] if tok.bos_token_id is not None else [tok.eos_token_ids[0]]

    def open_sequence(self, protected: bool = False) -> ProgramSequence:
        return RemoteSequence(self)

    def register_function(self, function: Function) -> None:
        self._functions[function.name] = function

    def lookup_function(self, name: str) -> Function | None:
        return self._functions.get(name)

    def compile(self, plan: GraphPlan) -> None:
        return None  # plans compile on the server, when registered

    def invalidate_plan(self, plan_hash: str) -> None:
        with self._lock:
            if plan_hash not in self._registered:
                return
            self._registered.discard(plan_hash)
        resp = self.http.delete(f"/plans/{plan_hash}")
        if resp.status_code != 404:
            _raise_for(resp)

    def clear_jit_cache(self) -> int:
        resp = self.http.post("/jit/clear")
        _raise_for(resp)
        return int(resp.json()["cleared"])

    def flush_cache(self) -> int:
        resp = self.http.post("/flush_cache")
        _raise_for(resp)
        return int(resp.json().get("pages_freed", 0))

    def get_server_info(self) -> dict[str, Any]:
        resp = self.http.get("/get_server_info")
        _raise_for(resp)
        return resp.json()

    # ----- plans run on the server -----
    def register_plan(self, plan: GraphPlan) -> dict[str, Any]:
        resp = self.http.post("/plans", json={"plan": plan.to_json()})
        _raise_for(resp)
        with self._lock:
            self._registered.add(plan.plan_hash)
        return resp.json()

    def run_plan(self, plan: GraphPlan, values: dict[str, str], defaults: RunDefaults) -> ProgramState:
        if plan.plan_hash not in self._registered:
            self.register_plan(plan)
        body = {"args": values, "defaults": defaults.to_dict()}
        resp = self.http.post(f"/plans/{plan.plan_hash}/run", json=body)
        if resp.status_code == 404:  # the server restarted or dropped it: register again, once
            self.register_plan(plan)
            resp = self.http.post(f"/plans/{plan.plan_hash}/run", json=body)
        _raise_for(resp)
        return ProgramState(FinishedProgram(resp.json()), plan_hash=plan.plan_hash)

    def close(self) -> None:
        self.http.close()
