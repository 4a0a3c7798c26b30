"""The fixed rows that per-rank summaries travel in: texts and floats packed into int64
words, and the timing row that ``aggregate`` gathers read back field for field."""

import math

import pytest

import gpukeeper
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.distributed.fixed_rows import (
    float_word,
    text_word_count,
    text_words,
    word_float,
    words_text,
)
from gpukeeper.distributed.rank_timings import (
    DEVICE_BYTES,
    NAME_BYTES,
    TIMING_VECTOR_LENGTH,
    RankTiming,
)
from gpukeeper.md.trajectory_result import TrajectoryResult

INT64 = (-(1 << 63), (1 << 63) - 1)


def _int64s(words):
    return all(isinstance(w, int) and INT64[0] <= w <= INT64[1] for w in words)


@pytest.mark.parametrize("text", ["", "a", "node-07", "x" * 16, "héllo wörld", "数据中心"])
def test_texts_that_fit_come_back_whole(text):
    words = text_words(text, 16)
    assert len(words) == text_word_count(16) == 3 and _int64s(words)
    assert words_text(words, 16) == text


def test_long_texts_are_cut_at_a_character_boundary():
    assert words_text(text_words("y" * 40, 16), 16) == "y" * 16
    # "é" is two bytes; the 16-byte cut falls between them, so the character is dropped
    assert words_text(text_words("z" * 15 + "é" + "tail", 16), 16) == "z" * 15
    assert text_words("y" * 40, 16)[0] == 40  # the full length travels


def test_text_sizes_and_rows_are_checked():
    for bad in (0, 12, -8):
        with pytest.raises(InvalidInputError, match="multiple of 8"):
            text_words("a", bad)
    with pytest.raises(InvalidInputError, match="takes 3 words, got 2"):
        words_text([1, 0], 16)


@pytest.mark.parametrize(
    "value", [0.0, -0.0, 1.5, 1e-300, -2.5e300, math.inf, -math.inf, 0.1 + 0.2]
)
def test_floats_travel_bit_for_bit(value):
    word = float_word(value)
    assert _int64s([word])
    back = word_float(word)
    assert back == value and math.copysign(1.0, back) == math.copysign(1.0, value)


def test_none_and_nan_travel_as_nan():
    assert math.isnan(word_float(float_word(None)))
    assert math.isnan(word_float(float_word(math.nan)))


# -------------------------------------------------------------------- the timing row


def _bench(name="train_step"):
    return gpukeeper.BenchmarkResult(
        name=name, times_ms=[1.0, 1.25, 1.5, 9.0], device="cuda:3 (NVIDIA H100 80GB HBM3)"
    )


def test_benchmark_row_round_trip():
    t = RankTiming.of(_bench(), 5, "node-07")
    row = t.to_vector()
    assert len(row) == TIMING_VECTOR_LENGTH and _int64s(row)
    assert RankTiming.from_vector(row) == t


def test_trajectory_row_round_trip_keeps_unknown_rates():
    traj = gpukeeper.benchmark_md_trajectory(
        lambda state: state, [None] * 12, warmup_steps=2, timestep_fs=2.0, device="cpu"
    )
    assert isinstance(traj, TrajectoryResult) and traj.ns_per_day is not None
    t = RankTiming.of(traj, 1, "h")
    back = RankTiming.from_vector(t.to_vector())
    assert back == t and back.kind == "trajectory" and back.ns_per_day == t.ns_per_day
    single = RankTiming.of(gpukeeper.BenchmarkResult(name="one", times_ms=[1.0]), 0, "h")
    back = RankTiming.from_vector(single.to_vector())
    assert back == single and back.ns_per_day is None


def test_long_texts_in_a_timing_row_are_cut():
    name = "f" * (NAME_BYTES + 10)
    t = RankTiming.of(_bench(name), 0, "h")
    t = RankTiming(**{**t.__dict__, "device": "d" * (DEVICE_BYTES + 1)})
    back = RankTiming.from_vector(t.to_vector())
    assert back.name == "f" * NAME_BYTES and back.device == "d" * DEVICE_BYTES
    assert back.median_ms == t.median_ms


def test_a_row_of_another_kind_is_refused():
    row = RankTiming.of(_bench(), 0, "h").to_vector()
    with pytest.raises(InvalidInputError, match="not a timing row"):
        RankTiming.from_vector(row[:-1])
    with pytest.raises(InvalidInputError, match="not a timing row"):
        RankTiming.from_vector([0] * TIMING_VECTOR_LENGTH)
