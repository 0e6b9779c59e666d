"""Exact nearest-neighbour peers for `spate bench vector`: numpy and faiss-cpu over the same
vectors, on the same machine.

    python vector_peers.py --items items.npy --queries queries.npy --k 10 --metric cosine \
        [--mask mask.npy]

Items and queries are float32 matrices (one row per vector); `--mask` a bool vector of the items
to search (the SQL filter). Prints one JSON object: per peer, queries per second and the ids of
each query's k nearest (ids index the full item matrix), or why the peer was skipped.

- numpy: one query at a time, a matrix-vector product and `argpartition`, as a user would.
- faiss: `IndexFlatIP` (inner product; cosine over L2-normalised vectors) or `IndexFlatL2`, all
  queries in one `search` call (faiss batches them). Building the index is not timed.
"""

import argparse
import json
import time

import numpy as np


def numpy_peer(items, queries, k, metric):
    if metric == "cosine":
        norms = np.linalg.norm(items, axis=1)
        norms[norms == 0] = np.inf
        items = items / norms[:, None]
    sq = (items * items).sum(axis=1) if metric == "l2" else None
    ids = []
    start = time.perf_counter()
    for q in queries:
        if metric == "l2":
            score = sq - 2.0 * (items @ q)
        elif metric == "cosine":
            score = -(items @ (q / max(np.linalg.norm(q), 1e-30)))
        else:
            score = -(items @ q)
        kk = min(k, len(score))
        if kk == 0:
            ids.append([])
            continue
        part = np.argpartition(score, kk - 1)[:kk]
        ids.append(part[np.lexsort((part, score[part]))].tolist())
    elapsed = time.perf_counter() - start
    return {"qps": len(queries) / max(elapsed, 1e-9), "ids": ids}


def faiss_peer(items, queries, k, metric):
    try:
        import faiss
    except ImportError as e:
        return {"skipped": f"faiss is not installed ({e}); scripts/test installs faiss-cpu in .venv"}
    items = np.ascontiguousarray(items, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if metric == "cosine":
        items = items.copy()
        queries = queries.copy()
        faiss.normalize_L2(items)
        faiss.normalize_L2(queries)
    dim = items.shape[1]
    index = faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim)
    index.add(items)
    start = time.perf_counter()
    _, found = index.search(queries, min(k, len(items)))
    elapsed = time.perf_counter() - start
    return {"qps": len(queries) / max(elapsed, 1e-9), "ids": found.tolist()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--items", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--metric", choices=["cosine", "ip", "l2"], required=True)
    p.add_argument("--mask")
    a = p.parse_args()
    items = np.load(a.items)
    queries = np.load(a.queries)
    ids = np.arange(len(items))
    if a.mask:
        keep = np.load(a.mask)
        items, ids = items[keep], ids[keep]
    out = {}
    for name, peer in [("numpy", numpy_peer), ("faiss", faiss_peer)]:
        result = peer(items, queries, a.k, a.metric)
        if "ids" in result:
            result["ids"] = [[int(ids[i]) for i in row if i >= 0] for row in result["ids"]]
        out[name] = result
    print(json.dumps(out))


if __name__ == "__main__":
    main()
