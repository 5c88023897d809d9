"""`PlanJit`: a runtime's plan compiler and its cache. `compile(plan)` returns the cached
`CompiledPlan` for (plan_hash, arch_hash) or builds one, logging exactly one line per compile.
A plan's tokenized prefix is also written to disk (under SGJIT_CACHE_DIR/plans), so a fresh process
compiling the same plan for the same arch and tokenizer skips that work; CUDA binaries persist
through CuPy's cache in the same directory."""

from __future__ import annotations

import json
import logging
import platform
import threading
import time
import weakref
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from sgjit.compiler.cache import JitCache
from sgjit.compiler.chat import render_static
from sgjit.compiler.compiled import CompiledPlan, leading_static_nodes, max_new_tokens
from sgjit.compiler.plan import GraphPlan
from sgjit.compiler.prefix import PrefixTokens, stable_prefix
from sgjit.errors import CapacityError
from sgjit.kernels.arch import arch_hash, device_profile
from sgjit.runtime.sampling_params import SamplingParams
from sgjit.settings import env

if TYPE_CHECKING:
    from sgjit.runtime.runtime import Runtime

log = logging.getLogger(__name__)


class PlanJit:
    def __init__(self, runtime: Runtime, limit: int, arg_budget: int) -> None:
        self._runtime = weakref.ref(runtime)
        self.cache = JitCache(limit)
        self.arg_budget = arg_budget
        profile = device_profile(runtime.device)
        self.arch_hash = arch_hash(profile)
        self.arch = f"sm_{profile.cc}" if profile.is_cuda else f"cpu-{platform.machine()}"
        self.disk_hits = 0
        self._lock = threading.Lock()

    @property
    def runtime(self) -> Runtime:
        rt = self._runtime()
        if rt is None:
            raise RuntimeError("the runtime of this JIT is gone")
        return rt

    @cached_property
    def _tokenizer_digest(self) -> str:
        return xxhash.xxh64_hexdigest(self.runtime.tokenizer.backend.to_str().encode())

    def _disk_path(self, plan: GraphPlan) -> Path:
        return (
            env().cache_dir
            / "plans"
            / f"{plan.plan_hash}-{self.arch_hash[:16]}-{self._tokenizer_digest[:16]}.json"
        )

    # ----- the cache -----
    def compile(self, plan: GraphPlan) -> CompiledPlan:
        key = (plan.plan_hash, self.arch_hash)
        hit = self.cache.get(key)
        if hit is not None:
            return hit  # type: ignore[return-value]
        with self._lock:  # one compile per plan, however many threads ask at once
            if key in self.cache:
                return self.cache.get(key)  # type: ignore[return-value]
            t0 = time.perf_counter()
            compiled = self._compile(plan)
            compiled.compile_ms = (time.perf_counter() - t0) * 1000
            self.cache.put(key, compiled, compiled.compile_ms)
        log.info(
            "JIT compiled GraphPlan %s arch %s hash %s in %.1f ms",
            compiled.label, self.arch, plan.plan_hash[:12], compiled.compile_ms,
        )  # fmt: skip
        return compiled

    def invalidate(self, plan_hash: str) -> int:
        return self.cache.invalidate(plan_hash)

    def clear(self) -> int:
        return self.cache.clear()

    def counters(self) -> dict[str, float]:
        c = self.cache.counters
        return {
            "jit_compiles": c.jit_compiles,
            "jit_cache_hits": c.jit_cache_hits,
            "jit_compile_ms_total": c.jit_compile_ms_total,
            "jit_evictions": c.jit_evictions,
            "jit_plans_cached": len(self.cache),
            "jit_disk_hits": self.disk_hits,
        }

    # ----- one compile -----
    def _static_prefix(self, plan: GraphPlan) -> tuple[str, bool]:
        """The text the plan's leading static nodes render to, exactly as a run renders it, and the
        add-special-tokens flag its first step will tokenize with."""
        tokenizer = self.runtime.tokenizer
        return render_static(
            leading_static_nodes(plan),
            lambda messages: tokenizer.apply_chat_template(messages, add_generation_prompt=False),
        )

    def _prefix_tokens(self, plan: GraphPlan, text: str, add_special: bool) -> tuple[PrefixTokens, bool]:
        path = self._disk_path(plan)
        try:
            d = json.loads(path.read_text())
            if d["text"] == text and d["add_special"] == add_special:
                self.disk_hits += 1
                return PrefixTokens(text, add_special, d["ids"], d["stable"], d["cut"]), True
        except (OSError, ValueError, KeyError):
            pass
        prefix = stable_prefix(self.runtime.tokenizer, text, add_special)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"text": text, **prefix.as_dict()}))
        except OSError as e:
            log.debug("plan cache not written: %s", e)
        return prefix, False

    def _compile(self, plan: GraphPlan) -> CompiledPlan:
        rt = self.runtime
        text, add_special = self._static_prefix(plan)
        prefix, from_disk = self._prefix_tokens(plan, text, add_special)
        choice_tokens = lambda c: rt.tokenizer.encode(c, add_special_tokens=False) or [0]  # noqa: E731
        generated = max_new_tokens(plan.nodes, SamplingParams().max_new_tokens, choice_tokens)
        worst = len(prefix.ids) + self.arg_budget * len(plan.text_args()) + generated
        limit = min(rt.max_model_len, rt.pool.capacity_tokens)
        if worst > limit:
            raise CapacityError(
                f"plan {plan.name} needs up to {worst} tokens ({len(prefix.ids)} prefix + "
                f"{self.arg_budget} per argument x {len(plan.text_args())} + {generated} generated) but this "
                f"runtime holds {limit}; lower the gens' max_tokens or raise max_model_len / max_total_tokens"
            )
        compiled = CompiledPlan(
            plan=plan, arch=self.arch, arch_hash=self.arch_hash, prefix=prefix, max_new_tokens=generated,
            worst_case_tokens=worst, from_disk=from_disk,
            kernels=rt.kernel_set.describe() if rt.kernel_set is not None else "",
            graph_buckets=rt.graph_summary(), _runtime=weakref.ref(rt),
        )  # fmt: skip
        if prefix.ids:  # prefill the constant prefix once; the handle pins its pages while cached
            req = rt.make_request(prefix.ids, {"max_new_tokens": 0}, hold_prefix=True)
            update = rt.run_request(req)
            if update.error is not None:
                raise update.error
            compiled.handle = update.handle
        return compiled
