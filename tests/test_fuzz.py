"""Fuzzing what a user types: RunConfig.from_dict and `hpclab run`'s options (hypothesis).

Every bad input must end as a ConfigError sentence (the CLI: exit 2), never another exception,
a traceback or a hang: the derived numbers (total steps, LR schedule length) are computed too,
so a step bomb is caught here. No engine starts: `hpclab run` validates exactly this way
(cli_run.run: base_config, then derived) before it starts a lab.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hpclab.core.config import RunConfig, field_names  # noqa: E402
from hpclab.core.errors import ConfigError  # noqa: E402
from hpclab.tools import cli, cli_fields  # noqa: E402

FAST = settings(
    max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-5, 300), max_size=4),
    st.tuples(st.integers(-5, 300), st.integers(-5, 300), st.integers(-5, 300)),
    st.sampled_from(["mnist1d", "cnn1d", "lars", "linear", "float32", "poly", "blobs", "1e9"]),
)
KEYS = st.one_of(st.sampled_from(field_names()), st.text(min_size=1, max_size=8))


@FAST
@given(st.dictionaries(KEYS, ANY_VALUE, max_size=5), st.integers(1, 64))
def test_any_dict_is_a_config_or_a_config_error(data, workers):
    try:
        cfg = RunConfig.from_dict(data)
        cfg.for_workers(workers).derived()  # total steps, LR schedule length, warm-up: all bounded
    except ConfigError as exc:
        text = str(exc)
        assert text.endswith(".") and "\n" not in text, text  # one sentence


OPTIONS = [f"--{name.replace('_', '-')}" for name in field_names() if name != "name"]
TOKENS = st.one_of(
    st.sampled_from(["0", "-1", "1e12", "nan", "inf", "", "2,3", "32,32,3", "lars", "x"]),
    st.text(alphabet="0123456789.,-e", max_size=8),
)


@FAST
@given(st.lists(st.tuples(st.sampled_from(OPTIONS), TOKENS), max_size=4), st.integers(0, 70))
def test_any_run_command_line_is_validated_or_refused_with_exit_2(pairs, workers):
    argv = ["run", "--workers", str(workers)] + [t for pair in pairs for t in pair]
    parser = cli.build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exc:  # the parser: one line naming the option and the value, exit 2
        said = err.getvalue()
        assert exc.code == 2 and "argument" in said and "Traceback" not in said, said
        return
    assert isinstance(args, argparse.Namespace)
    try:
        cfg = cli_fields.base_config(args, **cli_fields.field_values(args))
        cfg.for_workers(args.workers).derived()
    except ConfigError as exc:
        assert str(exc).endswith("."), str(exc)
