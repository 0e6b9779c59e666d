"""``DataFrame.nearest`` against numpy, on ``cpu`` and ``emulated``: fp16, bf16 and fp32
embeddings, the three metrics, one query and many, and a filter before the search.

numpy is the oracle, in float64 over the same (rounded) element values. Spate accumulates in
fp32, so distances agree to a relative 1e-5 and the ids exactly (the seeded data has no near
ties at the k-th place).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import spate
from spate.errors import ConfigError, PlanError

ROWS = 3000
DIM = 24


@pytest.fixture(scope="module", params=["cpu", "emulated"])
def backend(request: pytest.FixtureRequest) -> spate.Session:
    return spate.Session(backend=request.param)


def embeddings(matrix: np.ndarray, dtype: str) -> pa.Array:
    """A FixedSizeList embedding column of ``matrix``'s rows (bf16: UInt16 elements marked
    ``spate.bfloat16``; the values are the top halves of the float32s)."""
    if dtype == "bf16":
        bits = (matrix.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        field = pa.field("item", pa.uint16(), metadata={"spate.bfloat16": "true"})
        return pa.FixedSizeListArray.from_arrays(pa.array(bits.ravel()), type=pa.list_(field, DIM))
    values = pa.array(matrix.astype(dtype).ravel())
    return pa.FixedSizeListArray.from_arrays(values, DIM)


def items(dtype: str, seed: int = 5) -> tuple[pa.Table, np.ndarray]:
    """The table (id, u, emb) and the embeddings as float64 after rounding to ``dtype``."""
    rng = np.random.default_rng(seed)
    matrix = rng.uniform(-1, 1, (ROWS, DIM)).astype(np.float32)
    if dtype == "bf16":
        matrix = (matrix.view(np.uint32) & 0xFFFF0000).view(np.float32)
    elif dtype == "float16":
        matrix = matrix.astype(np.float16).astype(np.float32)
    table = pa.table(
        {
            "id": pa.array(np.arange(ROWS, dtype=np.int64)),
            "u": pa.array(rng.random(ROWS)),
            "emb": embeddings(matrix, dtype),
        }
    )
    return table, matrix.astype(np.float64)


def exact(matrix: np.ndarray, q: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest rows of ``matrix`` to ``q`` and their distances, nearest first."""
    q = q.astype(np.float32).astype(np.float64)
    if metric == "cosine":
        d = 1.0 - matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q))
        order = np.lexsort((np.arange(len(d)), d))
    elif metric == "ip":
        d = matrix @ q
        order = np.lexsort((np.arange(len(d)), -d))
    else:
        d = np.linalg.norm(matrix - q, axis=1)
        order = np.lexsort((np.arange(len(d)), d))
    top = order[:k]
    return top, d[top]


@pytest.mark.parametrize("dtype", ["float16", "bf16", "float32"])
@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_one_query_matches_numpy(backend: spate.Session, dtype: str, metric: str) -> None:
    table, matrix = items(dtype)
    q = np.random.default_rng(11).uniform(-1, 1, DIM)
    got = backend.from_arrow(table).nearest("emb", q, k=10, metric=metric).to_pandas()
    ids, distances = exact(matrix, q, 10, metric)
    assert got["id"].tolist() == ids.tolist()
    np.testing.assert_allclose(got["distance"].to_numpy(), distances, rtol=1e-5, atol=1e-6)
    assert list(got.columns) == ["id", "u", "emb", "distance"]


def test_many_queries_after_a_filter(backend: spate.Session) -> None:
    table, matrix = items("float16", seed=8)
    queries = np.random.default_rng(3).uniform(-1, 1, (5, DIM))
    df = backend.from_arrow(table)
    got = df[df.u < 0.3].nearest("emb", queries, k=7, metric="l2").to_pandas()
    keep = np.flatnonzero(table["u"].to_numpy() < 0.3)
    assert list(got.columns) == ["query", "id", "u", "emb", "distance"]
    assert got["query"].tolist() == [q for q in range(5) for _ in range(7)]
    for position, q in enumerate(queries):
        rows, distances = exact(matrix[keep], q, 7, "l2")
        part = got[got["query"] == position]
        assert part["id"].tolist() == keep[rows].tolist()
        np.testing.assert_allclose(part["distance"].to_numpy(), distances, rtol=1e-5)


def test_embeddings_round_trip_to_numpy(backend: spate.Session) -> None:
    table, matrix = items("float16")
    back = backend.from_arrow(table).sort_values("id").to_arrow()["emb"].combine_chunks()
    assert back.type == table["emb"].type
    flat = back.flatten().to_numpy(zero_copy_only=False).reshape(ROWS, DIM)
    np.testing.assert_array_equal(flat.astype(np.float64), matrix)


def test_nearest_on_the_gpu_is_a_top_k(backend: spate.Session) -> None:
    table, _ = items("float32")
    plan = backend.from_arrow(table).nearest("emb", [0.5] * DIM, k=3).explain()
    if backend.backend != "cpu":
        assert "GpuSortExec: TopK" in plan, plan
        # Each batch's nearest rows are picked before the distance column is computed.
        assert "GpuNearestExec" in plan, plan


def test_nearest_leaves_out_rows_without_a_distance(backend: spate.Session) -> None:
    """Fewer rows with a distance than k: those rows only, nearest first."""
    vectors = np.zeros((5, DIM), dtype=np.float32)
    vectors[1] = 1.0
    vectors[3] = 2.0
    table = pa.table({"id": pa.array(np.arange(5)), "emb": embeddings(vectors, "float32")})
    got = backend.from_arrow(table).nearest("emb", [1.0] * DIM, k=4, metric="cosine").to_pandas()
    # Zero vectors have no cosine distance; rows 1 and 3 point the query's way.
    assert sorted(got["id"].tolist()) == [1, 3]
    np.testing.assert_allclose(got["distance"].to_numpy(), [0.0, 0.0], atol=1e-6)


def test_bad_arguments_are_clear() -> None:
    cpu = spate.Session(backend="cpu")
    table, _ = items("float32")
    df = cpu.from_arrow(table)
    with pytest.raises(ConfigError, match="metric"):
        df.nearest("emb", [0.0] * DIM, metric="hamming")
    with pytest.raises(ConfigError, match="k must be"):
        df.nearest("emb", [0.0] * DIM, k=5000)
    with pytest.raises(ConfigError, match="different lengths"):
        df.nearest("emb", [[0.0] * DIM, [0.0] * 3])
    with pytest.raises(PlanError, match="no column"):
        df.nearest("missing", [0.0] * DIM)
    with pytest.raises(spate.errors.Error, match="same length"):
        df.nearest("emb", [0.0, 1.0]).to_pandas()


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_vector_topk_in_sql_matches_numpy(backend: spate.Session, metric: str) -> None:
    """``vector_topk`` answers many queries in one statement: fp16 items, fp32 queries."""
    table, matrix = items("float16")
    queries = np.random.default_rng(13).uniform(-1, 1, (7, DIM)).astype(np.float32)
    backend.register("vt_items", table)
    backend.register("vt_queries", pa.table({"emb": embeddings(queries, "float32")}))
    got = backend.sql(
        f"SELECT * FROM vector_topk(vt_items, emb, vt_queries, emb, 12, {metric}) "
        "ORDER BY query_row, rank"
    ).to_pandas()
    assert len(got) == 7 * 12
    for q in range(7):
        rows = got[got["query_row"] == q]
        ids, distances = exact(matrix, queries[q], 12, metric)
        assert rows["item_row"].tolist() == ids.tolist()
        assert rows["rank"].tolist() == list(range(1, 13))
        np.testing.assert_allclose(rows["distance"].to_numpy(), distances, rtol=1e-5, atol=1e-6)
