"""TGI's Prometheus metrics (§6): the same `tgi_*` names, types, labels and buckets, so
existing dashboards work.

Three sources feed `GET /metrics`: `RequestMetrics` (per request, updated by the handlers),
`StepRecorder` (per engine step: the engine calls it from its own thread; prometheus_client
is thread-safe) and `EngineGauges` (queue and batch gauges read from `engine.stats()` at
scrape time). `render()` writes the text format as TGI's exporter does: counters keep their
plain name (`tgi_request_count`, no `_total`) and no `_created` series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tgix.engine.request import Completion, EngineLimits

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = tuple(0.0001 * 1.5**k for k in range(1, 36))  # every *_duration
BATCH_SIZE_BUCKETS = tuple(float(n) for n in range(1, 1025))  # tgi_batch_next_size


def _steps(maximum: int) -> tuple[float, ...]:
    """100 equal buckets up to `maximum` (TGI's token-length histograms)."""
    step = max(maximum, 100) / 100
    return tuple(step * (i + 1) for i in range(100))


class StepRecorder:
    """The engine's per-step hook: `record_step(kind, duration_s, batch_size, num_tokens)`,
    kind "prefill" or "decode"; `ok=False` counts a failed step; `concat(reason)` counts
    requests joining a running batch ("chunking", "backpressure", "wait_exceeded")."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r, m = self.registry, ["method"]
        self.count = Counter("tgi_batch_inference_count", "Forward calls", m, registry=r)
        self.success = Counter("tgi_batch_inference_success", "Good forward calls", m, registry=r)
        self.failure = Counter("tgi_batch_inference_failure", "Failed forward calls", m, registry=r)
        self.duration = Histogram(
            "tgi_batch_inference_duration", "Step time", m, buckets=DURATION_BUCKETS, registry=r
        )
        self.forward = Histogram(
            "tgi_batch_forward_duration", "Forward time", m, buckets=DURATION_BUCKETS, registry=r
        )
        self.next_size = Histogram(
            "tgi_batch_next_size", "New batch sizes", buckets=BATCH_SIZE_BUCKETS, registry=r
        )
        self.concat_count = Counter(
            "tgi_batch_concat", "Requests joining a running batch", ["reason"], registry=r
        )
        self.tokens = Counter("tgix_batch_tokens", "Tokens fed to the model", m, registry=r)

    def __call__(
        self, kind: str, duration_s: float, batch_size: int, num_tokens: int, *, ok: bool = True
    ) -> None:
        self.count.labels(kind).inc()
        if not ok:
            self.failure.labels(kind).inc()
            return
        self.success.labels(kind).inc()
        self.duration.labels(kind).observe(duration_s)
        self.forward.labels(kind).observe(duration_s)
        self.tokens.labels(kind).inc(num_tokens)
        if kind == "prefill":
            self.next_size.observe(batch_size)

    def concat(self, reason: str) -> None:
        self.concat_count.labels(reason).inc()


record_step = StepRecorder()  # the process-wide hook the engine factory hands to the engine


class RequestMetrics:
    """Per-request counters and histograms, updated by the route handlers."""

    def __init__(self, limits: EngineLimits, registry: CollectorRegistry):
        r = registry
        self.count = Counter("tgi_request_count", "Requests received", registry=r)
        self.success = Counter("tgi_request_success", "Requests completed", registry=r)
        self.failure = Counter("tgi_request_failure", "Failed requests", ["err"], registry=r)

        def seconds(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=DURATION_BUCKETS, registry=r)

        self.duration = seconds("tgi_request_duration", "End-to-end time")
        self.validation = seconds("tgi_request_validation_duration", "Arrival to queued")
        self.queue = seconds("tgi_request_queue_duration", "Queued to first step")
        self.inference = seconds("tgi_request_inference_duration", "First step to end")
        self.per_token = seconds("tgi_request_mean_time_per_token_duration", "Time per token")
        total = _steps(limits.max_total_tokens)
        self.input_length = Histogram(
            "tgi_request_input_length",
            "Prompt tokens",
            buckets=_steps(limits.max_input_tokens),
            registry=r,
        )
        self.generated = Histogram(
            "tgi_request_generated_tokens", "Generated tokens", buckets=total, registry=r
        )
        self.max_new = Histogram(
            "tgi_request_max_new_tokens", "Requested max_new_tokens", buckets=total, registry=r
        )
        self.skipped = Summary("tgi_request_skipped_tokens", "Speculated tokens", registry=r)

    def succeeded(
        self, c: Completion, *, total_s: float, validation_s: float, max_new_tokens: int
    ) -> None:
        self.success.inc()
        self.duration.observe(total_s)
        self.validation.observe(validation_s)
        self.queue.observe(c.queue_time)
        self.inference.observe(c.inference_time)
        if c.generated_tokens:
            self.per_token.observe(c.inference_time / c.generated_tokens)
        self.input_length.observe(c.input_length)
        self.generated.observe(c.generated_tokens)
        self.max_new.observe(max_new_tokens)
        self.skipped.observe(c.skipped_tokens)

    def failed(self, label: str) -> None:
        self.failure.labels(label).inc()


class EngineGauges(Collector):
    """Queue, batch and KV-page gauges, read from engine.stats() when scraped."""

    def __init__(self, engine, limits: EngineLimits):
        self.engine = engine
        self.limits = limits

    def collect(self) -> Iterable[Metric]:
        stats = self.engine.stats()
        for name, key, doc in (
            ("tgi_queue_size", "queue_size", "Waiting requests"),
            ("tgi_batch_current_size", "batch_size", "Running requests"),
            ("tgi_batch_current_max_tokens", "batch_max_tokens", "KV tokens held"),
            # tgix extensions (TGI has no prefix-cache metric): the KV pages by state
            ("tgix_kv_free_pages", "free_pages", "KV pages free"),
            ("tgix_kv_used_pages", "used_pages", "KV pages held by requests"),
            ("tgix_prefix_cache_cached_pages", "cached_pages", "Unheld pages kept for reuse"),
            ("tgix_prefix_cache_shared_pages", "shared_pages", "Pages held by 2+ requests"),
            ("tgix_prefix_cache_hit_tokens", "prefix_hit_tokens", "Prompt tokens from cache"),
            ("tgix_prefix_cache_lookup_tokens", "prefix_lookup_tokens", "Prompt tokens looked up"),
            ("tgix_prefix_cache_hit_rate", "prefix_hit_rate", "Hit tokens / looked-up tokens"),
            ("tgix_prefix_cache_evictions", "prefix_evictions", "Cached pages evicted"),
        ):
            yield GaugeMetricFamily(name, doc, value=float(stats.get(key, 0.0)))
        yield GaugeMetricFamily(
            "tgi_batch_max_total_tokens",
            "KV cache capacity in tokens",
            value=float(self.limits.max_batch_total_tokens),
        )
        yield from expert_gauges(stats)
        yield from image_counters(getattr(self.engine, "vision", None))


def image_counters(vision) -> Iterable[Metric]:
    """A vision model's images encoded and the encoder's time (tgix.engine.vision_inputs)."""
    if vision is None:
        return
    yield CounterMetricFamily("tgix_images", "Images encoded", value=float(vision.images))
    yield CounterMetricFamily(
        "tgix_image_encode_seconds", "Time in the image encoder", value=vision.encode_seconds
    )


def expert_gauges(stats: dict) -> Iterable[Metric]:
    """An MoE model's expert load (tgix/engine/engine_stats.py), one sample per expert."""
    experts = sorted(
        int(k.split("_")[1]) for k in stats if k.endswith("_total") and k.startswith("expert_")
    )
    if not experts:
        return
    for name, suffix, doc in (
        ("tgix_expert_step_tokens", "last_step", "Assignments routed to each expert, last step"),
        ("tgix_expert_tokens", "total", "Assignments routed to each expert since start"),
    ):
        family = GaugeMetricFamily(name, doc + " (summed over MoE layers)", labels=["expert"])
        for e in experts:
            family.add_metric([str(e)], float(stats[f"expert_{e}_{suffix}"]))
        yield family


def render(*registries: CollectorRegistry) -> bytes:
    """Prometheus text exposition in TGI's dialect."""
    lines: list[str] = []
    for registry in registries:
        for metric in registry.collect():
            samples = [s for s in metric.samples if not s.name.endswith("_created")]
            if not samples:
                continue
            lines.append(f"# HELP {metric.name} {metric.documentation}")
            lines.append(f"# TYPE {metric.name} {metric.type}")
            for s in samples:
                name = s.name
                if metric.type == "counter" and name.endswith("_total"):
                    name = name[: -len("_total")]
                labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
                label_text = f"{{{labels}}}" if labels else ""
                lines.append(f"{name}{label_text} {floatToGoString(s.value)}")
    return ("\n".join(lines) + "\n").encode()
