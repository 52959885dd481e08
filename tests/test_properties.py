"""Property-based tests (hypothesis) of the parsers that read what a person or an agent
wrote: durations, config files, results.tsv, the ledger. Whatever the input: never a
traceback; either a value, a recovered record, or one AutoloopError line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoloop.config.loading import load_settings
from autoloop.config.settings import Settings
from autoloop.core.durations import parse_duration
from autoloop.core.errors import AutoloopError
from autoloop.store.ledger import TSV_COLUMNS, Ledger, LedgerRecord, format_tsv

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_line(error: Exception) -> None:
    assert isinstance(error, AutoloopError), repr(error)
    assert str(error).strip() and "\n" not in str(error).strip(), str(error)


def _record(trial: int, description: str) -> LedgerRecord:
    return LedgerRecord(trial=trial, started_at=1.0, ended_at=2.0, proposer="mutate", commit=f"{trial:040x}",
                        description=description, status="keep", metric=1.0 - trial / 100,
                        best=f"{trial:040x}", best_metric=1.0 - trial / 100)


# ------------------------------------------------------------------------------ durations

duration_text = st.one_of(
    st.text(max_size=20),
    st.from_regex(r"\s*[+-]?\d{0,4}(\.\d{0,3})?(h|m|s)?(\d{0,3}(m|s))?\s*", fullmatch=True),
    st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=2))


@QUICK
@given(duration_text)
def test_a_duration_is_a_positive_number_of_seconds_or_one_line(text):
    try:
        seconds = parse_duration(text)
    except AutoloopError as e:
        one_line(e)
        return
    assert seconds > 0 and seconds == seconds and seconds != float("inf")


# ------------------------------------------------------------------------------ config files

KEYS = sorted(Settings.model_fields)[:40]
toml_value = st.one_of(st.integers(-10**9, 10**9), st.floats(allow_nan=False), st.booleans(),
                       st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=15),
                       st.lists(st.integers(0, 9), max_size=3))


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)   # a JSON string is a TOML basic string
    return json.dumps(value) if isinstance(value, list) else repr(value)


@QUICK
@given(st.dictionaries(st.sampled_from(KEYS + ["no_such_key", "budget-s"]), toml_value, max_size=4))
def test_a_config_of_known_keys_and_any_values_loads_or_is_one_line(table):
    text = "".join(f"{key} = {_toml(value)}\n" for key, value in table.items())
    _load(text)


@QUICK
@given(st.text(max_size=200))
def test_any_text_as_a_config_file_loads_or_is_one_line(text):
    _load(text)


def _load(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "autoloop.toml").write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_settings(Path(tmp))
        except AutoloopError as e:
            one_line(e)


# ------------------------------------------------------------------------------ results.tsv

@QUICK
@given(st.lists(st.text(max_size=30), min_size=1, max_size=4), st.text(max_size=300))
def test_results_tsv_rows_stay_rows_and_a_forged_file_is_found(descriptions, forged):
    records = [_record(i, d) for i, d in enumerate(descriptions)]
    text = format_tsv(records)
    rows = text.splitlines()
    assert len(rows) == 1 + len(records)
    assert all(len(row.split("\t")) == len(TSV_COLUMNS) for row in rows)
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp), fsync=False)
        for record in records:
            ledger.append(record)
        assert ledger.tsv_differences() == []
        ledger.tsv_path.write_text(forged, encoding="utf-8", errors="surrogatepass")
        found = ledger.tsv_differences()
        assert (found == []) == (forged.splitlines() == rows)
        assert all(isinstance(line, str) and "\n" not in line for line in ledger.integrity_lines())


# ------------------------------------------------------------------------------ the ledger

FOREIGN = st.one_of(
    st.binary(max_size=60).filter(lambda b: b"\n" not in b),
    st.builds(lambda t, m: json.dumps({"trial": t, "started_at": 0, "ended_at": 1, "proposer": "x",
                                       "description": "foreign", "status": "keep", "metric": m}).encode(),
              st.integers(0, 9), st.floats(0, 1)),
    st.just(b'{"trial": 5, "sta'), st.just(b"[1, 2]"), st.just(b""))


def _genuine(n: int) -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp), fsync=False)
        for trial in range(n):
            ledger.append(_record(trial, f"change {trial}"))
        return ledger.path.read_bytes().splitlines()


GENUINE = _genuine(6)


@st.composite
def damaged_ledgers(draw) -> bytes:
    """The genuine lines, some duplicated, foreign lines interleaved, maybe cut anywhere."""
    lines: list[bytes] = []
    for line in GENUINE[:draw(st.integers(0, len(GENUINE)))]:
        lines.append(line)
        if draw(st.booleans()) and draw(st.booleans()):
            lines.append(line)                                  # duplicated
        if draw(st.booleans()) and draw(st.booleans()):
            lines.append(draw(FOREIGN))                         # interleaved
    data = b"\n".join(lines) + (b"\n" if lines else b"")
    if data and draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]           # truncated
    return data


@settings(max_examples=300, deadline=None)
@given(damaged_ledgers())
def test_a_damaged_ledger_gives_autoloops_records_or_one_line(data):
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp), fsync=False)
        ledger.path.write_bytes(data)
        for step in (ledger.records, ledger.repair, ledger.records, ledger.integrity_lines):
            try:
                out = step()
            except AutoloopError as e:
                one_line(e)
                return
            if isinstance(out, list) and out and isinstance(out[0], LedgerRecord):
                # Never a foreign record; autoloop's, each once, in order.
                assert all(r.description.startswith("change ") for r in out)
                trials = [r.trial for r in out]
                assert trials == sorted(set(trials))
