"""The Prometheus text-exposition reader (probes/exposition.py): tables of scrapes and the sums read from them."""

from __future__ import annotations

import pytest

from elasticd.probes.exposition import DEFAULT_RUNNING, DEFAULT_WAITING, metric_sums, used_of

VLLM = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B"} 0.0
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="meta-llama/Llama-3.1-8B"} 12.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B"} 40.0
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 1.0
"""

TGI = """\
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
# TYPE tgi_queue_size gauge
tgi_queue_size 2
"""


@pytest.mark.parametrize(("text", "names", "sums"), [
    ("", ["foo"], {}),  # empty text
    ("\n\n   \n", ["foo"], {}),  # blank lines only
    ("foo 1\n", [], {}),  # nothing asked for
    ("foo 1\n", ["foo"], {"foo": 1.0}),
    ("foo 1\nbar 2\n", ["foo"], {"foo": 1.0}),  # a name not asked for is not read
    ("foo 1\n", ["foo", "bar"], {"foo": 1.0}),  # a name not there is absent
    # comments, HELP and TYPE lines, OpenMetrics' EOF: skipped
    ("# a comment\n# HELP foo Help with foo 99 in it.\n# TYPE foo gauge\nfoo 2\n# EOF\n", ["foo"], {"foo": 2.0}),
    ("#foo 5\nfoo 2\n", ["foo"], {"foo": 2.0}),  # a comment that looks like a sample
    ("   foo 2   \n", ["foo"], {"foo": 2.0}),  # surrounding whitespace
    ("foo 2\r\nfoo 3\r\n", ["foo"], {"foo": 5.0}),  # CRLF line ends
    ("foo\t2\n", ["foo"], {"foo": 2.0}),  # a tab between name and value
    # timestamps are ignored, ms integers (Prometheus) or float seconds (OpenMetrics)
    ("foo 2 1712345678901\n", ["foo"], {"foo": 2.0}),
    ("foo{a=\"b\"} 2 1712345678.901\n", ["foo"], {"foo": 2.0}),
    ("foo 2 1712345678901 # {trace_id=\"x\"} 0.5\n", ["foo"], {"foo": 2.0}),  # an OpenMetrics exemplar
    ("foo 2 # {trace_id=\"x\"} 0.5\n", ["foo"], {"foo": 2.0}),  # an exemplar without a timestamp
    # values: floats, exponents, signs; non-finite ones are skipped
    ("foo 1.5e1\nfoo -0.5\nfoo +1\nfoo .5\n", ["foo"], {"foo": 16.0}),
    ("foo NaN\nfoo 3\n", ["foo"], {"foo": 3.0}),
    ("foo +Inf\nfoo -Inf\nfoo Inf\nfoo 1\n", ["foo"], {"foo": 1.0}),
    ("foo NaN\n", ["foo"], {}),  # only non-finite samples: absent
    ("foo +Inf\nfoo -Inf\n", ["foo"], {}),
    ("foo 1\nbar NaN\n", ["foo", "bar"], {"foo": 1.0}),
    # label sets: summed across series
    ('foo{a="1"} 1\nfoo{a="2"} 2\nfoo{a="3",b="x"} 3\n', ["foo"], {"foo": 6.0}),
    ('foo{} 4\n', ["foo"], {"foo": 4.0}),  # an empty label set
    ('foo{a="1",} 4\n', ["foo"], {"foo": 4.0}),  # a trailing comma
    ('foo { a = "1" } 4\n', ["foo"], {"foo": 4.0}),  # spaces around the braces and the equals sign
    ('foo{a="1"}4\n', ["foo"], {"foo": 4.0}),  # no space after the braces
    # quoted label values with spaces, braces, commas, equals signs and escapes: one sample each
    ('foo{path="/a b/c"} 1\n', ["foo"], {"foo": 1.0}),
    ('foo{a="}"} 1\n', ["foo"], {"foo": 1.0}),
    ('foo{a="x} 99"} 1\n', ["foo"], {"foo": 1.0}),  # a brace then a number inside the quotes
    ('foo{a="1,b=\\"2\\"",c="3"} 1\n', ["foo"], {"foo": 1.0}),  # escaped quotes and a comma inside them
    ('foo{a="back\\\\slash"} 1\n', ["foo"], {"foo": 1.0}),  # an escaped backslash before the closing quote
    ('foo{a="line\\nbreak"} 1\n', ["foo"], {"foo": 1.0}),
    ('foo{a="{nested}",b="}{"} 2\nfoo{a="x"} 3\n', ["foo"], {"foo": 5.0}),
    ('foo{a="ünïcødé ✓"} 1\n', ["foo"], {"foo": 1.0}),
    # names with colons; a name that is a prefix of another is not the other
    ("vllm:num_requests_running 3\n", ["vllm:num_requests_running"], {"vllm:num_requests_running": 3.0}),
    ("foo_total 5\nfoo 1\n", ["foo"], {"foo": 1.0}),
    ("foo_total 5\nfoo 1\n", ["foo_total"], {"foo_total": 5.0}),
    ('foo_total{a="1"} 5\nfoo{a="1"} 1\n', ["foo", "foo_total"], {"foo": 1.0, "foo_total": 5.0}),
    ("foo:bar 5\nfoo 1\n", ["foo"], {"foo": 1.0}),
    ("foo_bucket{le=\"1\"} 5\nfoo_sum 7\nfoo_count 9\n", ["foo"], {}),  # a histogram's series are not its name
    # garbage: skipped, never raised on, the good lines around it still read
    ("foo\nfoo 1\n", ["foo"], {"foo": 1.0}),  # no value
    ("foo one\nfoo 1\n", ["foo"], {"foo": 1.0}),  # not a number
    ("foo 1 2 3\nfoo 1\n", ["foo"], {"foo": 1.0}),  # too many fields
    ("foo 1 yesterday\nfoo 1\n", ["foo"], {"foo": 1.0}),  # a timestamp that is not one
    ("foo 1_000\nfoo 1\n", ["foo"], {"foo": 1.0}),  # Python's float() takes underscores; the format does not
    ("foo 0x10\nfoo 1\n", ["foo"], {"foo": 1.0}),
    ("foo-1\nfoo@x 1\nfoo 1\n", ["foo"], {"foo": 1.0}),  # no space after the name
    ('foo{a="1" 2\nfoo 1\n', ["foo"], {"foo": 1.0}),  # braces never closed
    ('foo{a="1} 2\nfoo 1\n', ["foo"], {"foo": 1.0}),  # a quote never closed
    ('foo{a=1} 2\nfoo 1\n', ["foo"], {"foo": 1.0}),  # an unquoted label value
    ('foo{a} 2\nfoo{="x"} 2\nfoo{a="1" b="2"} 2\nfoo 1\n', ["foo"], {"foo": 1.0}),  # label sets not well formed
    ('foo{a="1"}} 2\nfoo 1\n', ["foo"], {"foo": 1.0}),
    ("{} 2\n= 3\n\x00\x01 4\nfoo 1\n", ["foo"], {"foo": 1.0}),
    ("9foo 2\nfoo 1\n", ["foo"], {"foo": 1.0}),  # a name does not start with a digit
    ("<html><body>502 Bad Gateway</body></html>\n", ["foo"], {}),  # not an exposition at all
])
def test_metric_sums(text: str, names: list[str], sums: dict[str, float]) -> None:
    assert metric_sums(text, names) == sums


def test_metric_sums_takes_any_collection_of_names() -> None:
    text = "foo 1\nbar 2\nbaz 3\n"
    want = {"foo": 1.0, "bar": 2.0}
    assert metric_sums(text, ["foo", "bar"]) == want
    assert metric_sums(text, ("foo", "bar")) == want
    assert metric_sums(text, {"foo", "bar"}) == want
    assert metric_sums(text, frozenset({"foo", "bar"})) == want
    assert metric_sums(text, {"foo": 0, "bar": 0}) == want


def test_the_engine_scrapes_read_as_they_are_meant() -> None:
    names = [*DEFAULT_RUNNING, *DEFAULT_WAITING]
    assert metric_sums(VLLM, names) == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 4.0}
    assert metric_sums(SGLANG, names) == {"sglang:num_running_reqs": 7.0, "sglang:num_queue_reqs": 1.0}
    assert metric_sums(TGI, names) == {"tgi_batch_current_size": 5.0, "tgi_queue_size": 2.0}


def test_the_default_names() -> None:
    assert DEFAULT_RUNNING == ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")
    assert DEFAULT_WAITING == ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")


@pytest.mark.parametrize(("text", "running", "waiting", "used"), [
    (VLLM, DEFAULT_RUNNING, DEFAULT_WAITING, 9.0),  # 5 running + 4 waiting, across both engines' series
    (SGLANG, DEFAULT_RUNNING, DEFAULT_WAITING, 8.0),
    (TGI, DEFAULT_RUNNING, DEFAULT_WAITING, 7.0),
    ("", DEFAULT_RUNNING, DEFAULT_WAITING, None),  # nothing read: no reading, not zero
    ("# HELP x\nunrelated 4\n", DEFAULT_RUNNING, DEFAULT_WAITING, None),
    ("vllm:num_requests_waiting 3\n", DEFAULT_RUNNING, DEFAULT_WAITING, 3.0),  # only waiting: counts what it has
    ("tgi_batch_current_size 2\n", DEFAULT_RUNNING, DEFAULT_WAITING, 2.0),  # only running
    ("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", DEFAULT_RUNNING, DEFAULT_WAITING, 0.0),  # idle
    ("vllm:num_requests_running 0\n", DEFAULT_RUNNING, DEFAULT_WAITING, 0.0),  # a zero read is a reading
    # alternatives: the first name found of each list, not their sum
    ("vllm:num_requests_running 2\nsglang:num_running_reqs 10\n", DEFAULT_RUNNING, DEFAULT_WAITING, 2.0),
    ("sglang:num_running_reqs 10\nvllm:num_requests_running 2\n", DEFAULT_RUNNING, DEFAULT_WAITING, 2.0),
    ("sglang:num_running_reqs 10\ntgi_batch_current_size 2\n", DEFAULT_RUNNING, DEFAULT_WAITING, 10.0),
    ("vllm:num_requests_running 1\nsglang:num_queue_reqs 4\n", DEFAULT_RUNNING, DEFAULT_WAITING, 5.0),  # mixed
    # an alternative only of NaN is not found: the next one is taken
    ("vllm:num_requests_running NaN\nsglang:num_running_reqs 6\n", DEFAULT_RUNNING, DEFAULT_WAITING, 6.0),
    ("vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n", DEFAULT_RUNNING, DEFAULT_WAITING, None),
    # names of the capacity block's own
    ("my_running 3\nmy_waiting 1\n", ("my_running",), ("my_waiting",), 4.0),
    ("my_running 3\nmy_waiting 1\n", ("my_running",), (), 3.0),
    ("my_running 3\n", (), (), None),
])
def test_used_of(text: str, running: tuple[str, ...], waiting: tuple[str, ...], used: float | None) -> None:
    assert used_of(text, running, waiting) == used
