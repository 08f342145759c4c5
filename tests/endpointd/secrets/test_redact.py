"""The streaming secret redactor: every encoding masked, at any split, the same by both engines.

Expected encodings are produced here with the standard library (base64, urllib.parse, json,
shlex), independently of how :mod:`endpointd.secrets.redact` derives its patterns.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import re
import shlex
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from typing import cast

import pytest

from endpointd.secrets import redact
from endpointd.secrets.redact import MIN_DERIVED_BYTES, Engine, Redactor, credential_patterns

ENGINES = ["hyperscan", "python"]
# Control bytes: no pattern can contain them, so no match reaches into the context.
BEFORE = b"before \x02"
AFTER = b"\x03 after"

FIXED_VALUES = [
    b"ghp_a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuVwXyZ",
    b'p@ss "w/o+rd" \\ back',  # quotes, slash, plus, backslash, spaces
    b"it's a $HOME `cmd` & <tag> 100%",  # shell and HTML specials, percent
    "pässwörd-日本語-🔑-x".encode(),  # non-ASCII
    b"-----BEGIN KEY-----\nQUJDREVGR0hJSktMTU5PUFFS\n  indented  \r\nab\n-----END KEY-----\n",
    b"nul\x00byte/and+more=",  # any byte, even NUL
    b"Zq8!xW2$",  # the shortest value the store accepts
]
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \"'\\/+=%&$`<>!*()[]{}#~é日🔑\t"
)


def random_values(rng: random.Random, count: int) -> list[bytes]:
    values = []
    for _ in range(count):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(8, 40)))
        if rng.random() < 0.3:  # multi-line
            text += "\n" + "".join(rng.choice(ALPHABET) for _ in range(rng.randint(4, 20)))
        values.append(text.encode())
    return values


VALUES = FIXED_VALUES + random_values(random.Random(20261130), 6)
MULTI_LINE = [v for v in VALUES if len(v.splitlines()) > 1]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    # hyperscan is a dependency of the daemon: a missing one fails these tests, never skips.
    return str(request.param)


def redactor_for(values: list[bytes], engine: str) -> Redactor:
    redactor = Redactor({f"cred{i}": v for i, v in enumerate(values)}, engine=cast(Engine, engine))
    assert redactor.engine == engine
    return redactor


def streamed(redactor: Redactor, chunks: list[bytes]) -> bytes:
    stream = redactor.stream()
    out = b"".join(stream.feed(c) for c in chunks) + stream.flush()
    assert len(out) == sum(map(len, chunks))
    return out


def assert_form_masked(redactor: Redactor, form: bytes) -> None:
    """The form, between context bytes, comes out fully masked with the context intact,
    one-shot, fed byte by byte, and split at every point."""
    data = BEFORE + form + AFTER
    expected = BEFORE + b"*" * len(form) + AFTER
    assert redactor.bytes(data) == expected, form
    assert streamed(redactor, [bytes([b]) for b in data]) == expected, form
    for cut in range(1, len(data)):
        assert streamed(redactor, [data[:cut], data[cut:]]) == expected, (form, cut)


# --- every form -------------------------------------------------------------------------------


def url_forms(value: bytes) -> Iterator[bytes]:
    yield urllib.parse.quote(value, safe="").encode()
    yield urllib.parse.quote(value).encode()  # '/' kept
    yield urllib.parse.quote_plus(value).encode()
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(value))
    yield lower_hex.encode()


def json_forms(value: bytes) -> Iterator[bytes]:
    text = value.decode("utf-8")
    yield json.dumps(text)[1:-1].encode()
    yield json.dumps(text, ensure_ascii=False)[1:-1].encode()


def shell_forms(value: bytes) -> Iterator[bytes]:
    yield shlex.quote(value.decode("latin-1")).encode("latin-1")
    safe = set(b"_@%+=:,./-")
    yield b"".join(
        b"\\" + bytes([c]) if c < 0x80 and not (chr(c).isalnum() or c in safe) else bytes([c])
        for c in value
    )
    inside_double_quotes = b"".join(
        b"\\" + bytes([c]) if c in b'"\\$`' else bytes([c]) for c in value
    )
    yield inside_double_quotes


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_raw_url_json_and_shell_forms_are_masked(value: bytes, engine: str) -> None:
    redactor = redactor_for([value], engine)
    forms = [value, *url_forms(value), *json_forms(value), *shell_forms(value)]
    for form in forms:
        assert_form_masked(redactor, form)


@pytest.mark.parametrize("value", MULTI_LINE, ids=range(len(MULTI_LINE)))
def test_each_line_of_a_multi_line_value_is_masked(value: bytes, engine: str) -> None:
    lines = {form for line in value.splitlines() for form in (line, line.strip()) if len(form) >= 4}
    redactor = redactor_for([value], engine)
    for line in lines:
        assert_form_masked(redactor, line)
    short = [line for line in value.splitlines() if 0 < len(line.decode()) < 4]
    for line in short:  # e.g. "ab": too short to mask on its own
        assert redactor.bytes(BEFORE + line + AFTER) == BEFORE + line + AFTER


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_base64_is_masked_at_every_shift_alphabet_and_padding(value: bytes, engine: str) -> None:
    redactor = redactor_for([value], engine)
    rng = random.Random(value)
    n = len(value)
    for shift in (0, 1, 2):
        for after in (b"", rng.randbytes(1), rng.randbytes(2), rng.randbytes(5)):
            raw = rng.randbytes(shift) + value + after
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                for padded in (True, False):
                    encoded = encode(raw) if padded else encode(raw).rstrip(b"=")
                    data = BEFORE + encoded + AFTER
                    # Characters [first, end) carry only bits of the value.
                    first, end = -(-8 * shift // 6), 8 * (shift + n) // 6
                    if not after:  # the value ends the stream: the rest is known too
                        end = len(encoded)
                    out = redactor.bytes(data)
                    at = len(BEFORE)
                    assert out[at + first : at + end] == b"*" * (end - first), (shift, after)
                    assert out[:at] == BEFORE
                    assert out[at + len(encoded) :] == AFTER
                    assert len(out) == len(data)
                    # The same, fed in two pieces split inside the encoding.
                    cut = at + first + (end - first) // 2
                    assert streamed(redactor, [data[:cut], data[cut:]]) == out


def test_base64_of_user_colon_value_is_masked_as_in_basic_auth(engine: str) -> None:
    value = b"s3cr3t-t0ken-value"
    redactor = redactor_for([value], engine)
    header = b"Authorization: Basic " + base64.b64encode(b"alice:" + value) + b"\r\n"
    out = redactor.bytes(header)
    assert out.startswith(b"Authorization: Basic YWxpY2U6")  # "alice:" stays readable
    assert out.count(b"*") >= len(value) * 4 // 3 - 2
    assert base64.b64encode(value)[:8] not in out


# --- streaming ---------------------------------------------------------------------------------


def test_every_split_point_of_a_chunk_with_secrets_gives_the_one_shot_output(engine: str) -> None:
    values = [VALUES[0], VALUES[1], VALUES[3]]
    redactor = redactor_for(values, engine)
    data = (
        b"log line one\n"
        + values[0]
        + b"\njson: "
        + json.dumps(values[1].decode())[1:-1].encode()
        + b" b64="
        + base64.b64encode(b"x" + values[2])
        + b" url="
        + urllib.parse.quote_plus(values[1]).encode()
        + b"\ntrailer\n"
    )
    expected = redactor.bytes(data)
    assert expected.count(b"*") > 3 * 20
    assert values[0] not in expected
    for cut in range(len(data) + 1):
        assert streamed(redactor, [data[:cut], data[cut:]]) == expected, cut
    for a in range(0, len(data), 7):  # three pieces
        for b in range(a, len(data), 11):
            assert streamed(redactor, [data[:a], data[a:b], data[b:]]) == expected, (a, b)
    assert streamed(redactor, [bytes([c]) for c in data]) == expected


def test_ordinary_output_is_released_at_once_and_only_a_possible_secret_start_is_held(
    engine: str,
) -> None:
    value = b"tok_9f8e7d6c5b4a"
    redactor = redactor_for([value], engine)
    stream = redactor.stream()
    assert stream.feed(b"compiling module 1\n") == b"compiling module 1\n"
    # "to" and "tok_9f" could begin the value: only they are held.
    assert stream.feed(b"note to") == b"note "
    assert stream.feed(b" self: tok_9f") == b"to self: "
    assert stream.feed(b"8e7d6c5b4a!") == b"*" * len(value) + b"!"
    assert stream.flush() == b""
    # A tail that never completes comes out unchanged at the end.
    assert stream.feed(b"prefix tok_9f8e7d6c5b") == b"prefix "
    assert stream.flush() == b"tok_9f8e7d6c5b"
    assert stream.flush() == b""


def test_text_that_merely_shares_a_prefix_is_not_masked(engine: str) -> None:
    value = b"AKIAQWERTYUIOPASDF12"
    redactor = redactor_for([value], engine)
    near_misses = [
        value[:-1] + b"3",
        value[:10] + b" " + value[10:],
        value[1:],
        value[:-1],
        base64.b64encode(value[:-2] + b"zz")[:12],
    ]
    for text in near_misses:
        data = b"x=" + text + b";\n"
        assert redactor.bytes(data) == data
        assert streamed(redactor, [bytes([c]) for c in data]) == data
        assert streamed(redactor, [data[:-2], data[-2:]]) == data


def test_overlapping_and_adjacent_matches_are_all_masked(engine: str) -> None:
    first, second = b"AAAAkeyXYZ12", b"XYZ12secondval"  # the end of one begins the other
    redactor = redactor_for([first, second, b"xyxyxyxy"], engine)
    cases = [
        (b"xyxyxyxyxyxy", 12),  # a value overlapping itself
        (b"AAAAkeyXYZ12secondval", 21),  # overlapping
        (first + second, 26),  # adjacent
        (first + first, 24),  # the same value twice in a row
        (b"AAAAkeyAAAAkeyXYZ12", 12),  # a false start (kept), then the value
    ]
    for text, masked in cases:
        data = b"<" + text + b">"
        out = redactor.bytes(data)
        assert out == b"<" + text[: len(text) - masked] + b"*" * masked + b">", text
        for cut in range(len(data) + 1):
            assert streamed(redactor, [data[:cut], data[cut:]]) == out


def test_a_match_ending_inside_the_held_tail_stays_masked(engine: str) -> None:
    # "XYZ12" completes `first` and is also the start of `second`, so it is held back
    # already masked; the rest never completes `second`.
    first, second = b"AAAAkeyXYZ12", b"XYZ12secondval"
    redactor = redactor_for([first, second], engine)
    stream = redactor.stream()
    assert stream.feed(b"go AAAAkeyXYZ12") == b"go *******"
    assert stream.flush() == b"*****"
    assert stream.feed(b"AAAAkeyXYZ12") == b"*******"
    assert stream.feed(b"sec") == b""
    assert stream.feed(b"!") == b"*****sec!"


# --- the two engines ---------------------------------------------------------------------------


def reference(values: list[bytes], data: bytes) -> bytes:
    """Mask every occurrence of every pattern, the obvious way."""
    out = bytearray(data)
    for value in values:
        for pattern in credential_patterns(value):
            at = data.find(pattern)
            while at >= 0:
                out[at : at + len(pattern)] = b"*" * len(pattern)
                at = data.find(pattern, at + 1)
    return bytes(out)


def noisy_input(rng: random.Random, values: list[bytes]) -> bytes:
    """Random text sprinkled with whole forms, pieces of forms and near misses."""
    patterns = sorted(p for v in values for p in credential_patterns(v))
    parts = []
    for _ in range(rng.randint(5, 40)):
        kind = rng.random()
        if kind < 0.3:
            parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30))).encode())
        elif kind < 0.55:
            parts.append(rng.choice(patterns))
        elif kind < 0.8:
            p = rng.choice(patterns)
            i = rng.randrange(len(p))
            parts.append(p[:i] if rng.random() < 0.5 else p[i:])
        else:
            flipped = bytearray(rng.choice(patterns))
            flipped[rng.randrange(len(flipped))] ^= 0x01
            parts.append(bytes(flipped))
    return b"".join(parts)


def test_both_engines_and_the_reference_agree_on_random_inputs() -> None:
    rng = random.Random(4)
    for round_ in range(80):
        values = random_values(rng, rng.randint(1, 4))
        fast = redactor_for(values, "hyperscan")
        slow = redactor_for(values, "python")
        for _ in range(4):
            data = noisy_input(rng, values)
            expected = reference(values, data)
            assert fast.bytes(data) == expected, round_
            assert slow.bytes(data) == expected, round_
            cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 6)))
            chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            assert streamed(fast, chunks) == expected, (round_, cuts)
            assert streamed(slow, chunks) == expected, (round_, cuts)
            assert streamed_in_pieces(fast, chunks) == expected, (round_, cuts)


def streamed_in_pieces(redactor: Redactor, chunks: list[bytes]) -> bytes:
    """What the daemon sends: ``feed_pieces``, joined, then the flush."""
    stream = redactor.stream()
    return b"".join(b"".join(stream.feed_pieces(c)) for c in chunks) + stream.flush()


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_feed_pieces_is_feed_without_the_copies(engine: str, chunk: int) -> None:
    rng = random.Random(chunk)
    values = random_values(rng, 3)
    redactor = redactor_for(values, engine)
    data = b"".join(noisy_input(rng, values) for _ in range(20))
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    assert streamed_in_pieces(redactor, chunks) == reference(values, data)


def test_the_fallback_is_chosen_by_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENDPOINTD_REDACT_ENGINE", "python")
    redactor = Redactor({"a": b"some-secret-value"})
    assert redactor.engine == "python"
    assert redactor.bytes(b"x some-secret-value y") == b"x " + b"*" * 17 + b" y"


def test_without_hyperscan_the_fallback_is_used_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "hyperscan", None)  # makes `import hyperscan` fail
    monkeypatch.delenv("ENDPOINTD_REDACT_ENGINE", raising=False)
    redact._warn_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="endpointd.secrets.redact"):
        first = Redactor({"a": b"some-secret-value"})
        second = Redactor({"b": b"other-secret-value"})
    assert first.engine == second.engine == "python"
    assert second.bytes(b"other-secret-value") == b"*" * 18
    assert [r.getMessage() for r in caplog.records] == [
        "hyperscan is not installed; redacting with the slower pure-Python matcher"
    ]
    with pytest.raises(ImportError):
        Redactor({"a": b"some-secret-value"}, engine="hyperscan")


def test_streams_of_one_redactor_run_in_parallel_threads() -> None:
    value = b"parallel-secret-123"
    redactor = redactor_for([value], "hyperscan")
    data = (b"lorem ipsum " * 5000 + value + b"\n") * 4
    expected = redactor.bytes(data)
    results: list[bytes] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                results.append(
                    streamed(redactor, [data[i : i + 4096] for i in range(0, len(data), 4096)])
                )
            for _ in range(20):
                results.append(redactor.bytes(data))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 160
    assert all(r == expected for r in results)


# --- one-shot, empty, patterns -----------------------------------------------------------------


def test_bytes_and_text_one_shot(engine: str) -> None:
    value = "pässwörd-日本語-🔑-x".encode()
    redactor = redactor_for([value, b"plain-ascii-token"], engine)
    assert redactor.bytes(b"") == b""
    assert redactor.bytes(b"a plain-ascii-token b") == b"a " + b"*" * 17 + b" b"
    assert redactor.text("a plain-ascii-token b") == "a " + "*" * 17 + " b"
    # A string: each character of the value becomes one '*', the rest is untouched.
    text = "über " + value.decode() + " 終"
    masked = redactor.text(text)
    assert masked == "über " + "*" * len(value.decode()) + " 終"
    assert redactor.text("nothing here, ünïcode") == "nothing here, ünïcode"
    # JSON-escaped inside a string, as in a log line.
    escaped = json.dumps({"password": value.decode()})
    assert value.decode() not in redactor.text(escaped)
    assert redactor.text(escaped) == '{"password": "' + "*" * (len(escaped) - 16) + '"}'


def test_no_credentials_is_a_pass_through() -> None:
    for redactor in (Redactor.empty(), Redactor({})):
        assert redactor.engine == "none"
        assert redactor.max_len == 0
        stream = redactor.stream()
        chunk = b"anything at all " * 100
        assert stream.feed(chunk) is chunk
        assert stream.flush() == b""
        assert redactor.bytes(chunk) is chunk
        assert redactor.text("x") == "x"


def test_patterns_are_deduplicated_short_ones_dropped_and_never_shown() -> None:
    value = b"abcd\nab\nlong-enough-line\nxyz\n"
    patterns = credential_patterns(value)
    assert {value, b"abcd", b"long-enough-line"} <= patterns
    assert not {b"ab", b"xyz"} & patterns
    assert all(len(p) >= MIN_DERIVED_BYTES for p in patterns - {value, b"abcd"})
    # An alphanumeric token's raw, JSON, URL and shell forms are one pattern.
    token = b"AbCdEfGh12345678"
    assert len({p for p in credential_patterns(token) if b"=" not in p and len(p) == 16}) == 1
    redactor = Redactor({"deploy": value, "token": token})
    assert redactor.max_len == max(len(p) for p in patterns | credential_patterns(token))
    assert "long-enough" not in repr(redactor)
    assert "AbCd" not in repr(redactor)
