//! The k nearest items to each of many query vectors: `kernels/cuda/vector/topk.cu`.
//!
//! A [`NearestItems`] holds, per query, its running best: at most `k` (distance key, item)
//! entries, in device memory. [`NearestItems::add_items`] scores one batch of items against
//! every query and merges the batch's nearest into the running bests (two launches per group
//! of queries, no readback); [`NearestItems::finish`] sorts each query's entries and writes the
//! output columns, with their row count left on the device. The distance matrix is never
//! held: a batch's candidates are at most `k` per query and tile of
//! [`TILE`](crate::launch::TILE) items, and the queries are taken in groups whose candidates
//! fit the given budget.
//!
//! An item's position is its row in the batch plus the rows of the batches added before it.
//! Entries order by distance, nearest first (the largest inner product first), then by
//! position, so ties keep the earlier item. An item with no distance (NULL, or NaN) is never
//! an entry, so a query may have fewer than `k`.

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig, TILE};
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceSlice};
use crate::stream::Stream;

/// The largest `k`: a query's running best is sorted by one block.
pub const MAX_K: usize = 4096;

/// The most queries of one launch of the tile kernel (a grid's y dimension).
const MAX_GRID_Y: usize = 65_535;

/// Bytes of one candidate entry: its key and its item.
const ENTRY_BYTES: usize = 16;

/// Which items count as nearest, and whether those without a distance count at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The nearest (the largest inner product); an item whose distance is NULL or NaN is never
    /// an entry (`vector_topk`).
    Nearest,
    /// The first rows of an SQL sort of the distance, in total order (NaN above every number),
    /// the rows without a distance NULL at their end: a pre-selection for `ORDER BY distance
    /// LIMIT k`.
    Sql { descending: bool, nulls_first: bool },
}

impl Order {
    /// The number `topk.cu`'s `order_key` knows this order by.
    fn code(self) -> u32 {
        match self {
            Order::Nearest => 0,
            Order::Sql {
                descending,
                nulls_first,
            } => 1 + u32::from(nulls_first) + 2 * u32::from(descending),
        }
    }
}

/// Embeddings in device memory: `rows` vectors of `dim` elements, row `i` at byte
/// `i * dim * width` of `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Vectors<'a> {
    /// The elements, row after row.
    pub bytes: DeviceSlice<'a, u8>,
    /// Row validity, or `None` when no row is NULL.
    pub validity: Option<DeviceBitmap<'a>>,
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub dim: usize,
    /// The element type's code (`0` f32, `1` f16, `2` bf16, as `vector.cuh` numbers them).
    pub elem: u32,
}

impl Vectors<'_> {
    fn width(&self) -> usize {
        if self.elem == 0 { 4 } else { 2 }
    }

    fn check(&self, what: &str) -> Result<()> {
        ensure_arg!(self.elem <= 2, "{what}: no element type {}", self.elem);
        ensure_arg!(self.dim > 0, "{what}: vectors of no elements");
        let bytes = self
            .rows
            .checked_mul(self.dim)
            .and_then(|e| e.checked_mul(self.width()));
        ensure_arg!(
            bytes.is_some_and(|b| b <= self.bytes.len()),
            "{what}: {} bytes hold fewer than {} vectors of {} elements",
            self.bytes.len(),
            self.rows,
            self.dim
        );
        if let Some(v) = &self.validity {
            v.check_covers(self.rows, what)?;
        }
        Ok(())
    }

    fn args(&self) -> [KernelArg; 3] {
        [
            self.bytes.into(),
            self.validity.into(),
            KernelArg::U64(self.validity.map_or(0, |v| v.offset as u64)),
        ]
    }
}

/// One half of the running bests: `stride` slots of keys and items per query, and a count.
#[derive(Debug)]
struct Best {
    keys: DeviceBuffer<u64>,
    items: DeviceBuffer<u64>,
    counts: DeviceBuffer<u32>,
}

impl Best {
    fn new(stream: &Stream, queries: usize, stride: usize) -> Result<Self> {
        Ok(Best {
            keys: stream.alloc(queries * stride)?,
            items: stream.alloc(queries * stride)?,
            counts: stream.alloc_zeroed(queries)?,
        })
    }
}

/// The output of [`NearestItems::finish`]: `bound` rows allocated, `count` (on the device)
/// written, query after query, each query's nearest first.
#[derive(Debug)]
pub struct Nearest {
    /// The query's position among the queries.
    pub query: DeviceBuffer<u64>,
    /// The item's position among the items.
    pub item: DeviceBuffer<u64>,
    /// 1 for a query's nearest item, then 2, 3, …
    pub rank: DeviceBuffer<u64>,
    /// The distance (the inner product for that metric).
    pub distance: DeviceBuffer<f64>,
    /// The rows written: one u32.
    pub count: DeviceBuffer<u32>,
    /// The rows allocated: queries × k.
    pub bound: usize,
}

/// The running nearest items of every query (see the module docs).
#[derive(Debug)]
pub struct NearestItems {
    queries: usize,
    k: usize,
    /// Slots per query in the running bests: `k` rounded up to a power of two.
    stride: usize,
    metric: u32,
    order: Order,
    /// The running best, and the other half the next merge writes.
    best: [Best; 2],
    current: usize,
    /// Items added so far: the position of the next batch's row 0 (at most, after a batch
    /// counted on the device).
    items: u64,
    /// False after a batch counted on the device: no more items.
    open: bool,
}

impl NearestItems {
    /// Running bests for `queries` queries, each keeping `k` items (1 to [`MAX_K`]) nearest
    /// by `metric` (`0` cosine distance, `1` inner product, `2` Euclidean).
    pub fn new(stream: &Stream, queries: usize, k: usize, metric: u32) -> Result<Self> {
        Self::ordered(stream, queries, k, metric, Order::Nearest)
    }

    /// [`NearestItems::new`], keeping the first `k` items of `order`.
    pub fn ordered(
        stream: &Stream,
        queries: usize,
        k: usize,
        metric: u32,
        order: Order,
    ) -> Result<Self> {
        ensure_arg!(
            (1..=MAX_K).contains(&k),
            "a vector top-k of {k} items; k must be 1 to {MAX_K}"
        );
        ensure_arg!(metric <= 2, "no vector metric {metric}");
        ensure_arg!(
            queries < i32::MAX as usize,
            "{queries} queries pass a grid's blocks"
        );
        ensure_arg!(
            queries
                .checked_mul(k)
                .is_some_and(|n| n < u32::MAX as usize),
            "{queries} queries × k = {k} pass an output's 2^32 - 1 rows"
        );
        let stride = k.next_power_of_two();
        Ok(NearestItems {
            queries,
            k,
            stride,
            metric,
            order,
            best: [
                Best::new(stream, queries, stride)?,
                Best::new(stream, queries, stride)?,
            ],
            current: 0,
            items: 0,
            open: true,
        })
    }

    /// Items added so far.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Queries per launch of the tile kernel for a batch of `tiles` tiles, so that their
    /// candidates take at most `budget` bytes (at least one query).
    fn group(&self, tiles: usize, budget: usize) -> usize {
        let per_query = tiles * self.k.min(TILE) * ENTRY_BYTES;
        (budget / per_query.max(1)).clamp(1, MAX_GRID_Y.min(self.queries.max(1)))
    }

    /// Scores `items` against `queries` (the same queries every call, of the same dimension)
    /// and merges each query's nearest into its running best. Candidates take at most about
    /// `budget` bytes at a time. The launches: two per group of queries.
    pub fn add_items(
        &mut self,
        stream: &Stream,
        items: Vectors<'_>,
        queries: Vectors<'_>,
        budget: usize,
    ) -> Result<()> {
        self.add_counted(stream, items, None, queries, budget)
    }

    /// [`NearestItems::add_items`] for items whose row count is on the device (`live`, one
    /// u32 at most `items.rows`), so that nothing waits for it. Their rows place no later
    /// batch, so they must be the only items.
    pub fn add_counted(
        &mut self,
        stream: &Stream,
        items: Vectors<'_>,
        live: Option<DeviceSlice<'_, u32>>,
        queries: Vectors<'_>,
        budget: usize,
    ) -> Result<()> {
        ensure_arg!(
            self.open,
            "items added after a batch whose row count is on the device"
        );
        if let Some(live) = &live {
            ensure_arg!(live.len() == 1, "a row count of {} words", live.len());
            ensure_arg!(
                self.items == 0,
                "a batch whose row count is on the device after other items"
            );
            self.open = false;
        }
        items.check("vector top-k items")?;
        queries.check("vector top-k queries")?;
        ensure_arg!(
            queries.rows == self.queries,
            "{} query vectors for a top-k of {}",
            queries.rows,
            self.queries
        );
        ensure_arg!(
            items.dim == queries.dim,
            "items of {} elements against queries of {}",
            items.dim,
            queries.dim
        );
        let base = self.items;
        self.items += items.rows as u64;
        if items.rows == 0 || self.queries == 0 {
            return Ok(());
        }
        let tiles = items.rows.div_ceil(TILE);
        ensure_arg!(
            tiles < i32::MAX as usize,
            "{} items pass a grid's tiles",
            items.rows
        );
        let slots = self.k.min(TILE);
        let group = self.group(tiles, budget);
        let device = stream.device();
        let tile_kernel = device.kernel(&format!(
            "vector_topk_tiles_{}_{}_{}",
            self.metric, items.elem, queries.elem
        ))?;
        let merge = device.kernel("vector_topk_merge")?;
        let lists = group * tiles;
        let cand_keys = stream.alloc::<u64>(lists * slots)?;
        let cand_items = stream.alloc::<u64>(lists * slots)?;
        let cand_counts = stream.alloc::<u32>(lists)?;
        let (now, next) = (self.current, 1 - self.current);
        let mut first = 0;
        while first < self.queries {
            let in_group = group.min(self.queries - first);
            let mut args = items.args().to_vec();
            args.extend([
                live.map_or_else(KernelArg::null, Into::into),
                KernelArg::U64(items.rows as u64),
                KernelArg::U64(base),
            ]);
            args.extend(queries.args());
            args.extend([
                KernelArg::U64(first as u64),
                KernelArg::U64(items.dim as u64),
                KernelArg::U32(self.k as u32),
                KernelArg::U32(self.order.code()),
                KernelArg::U32(slots as u32),
                (&cand_keys).into(),
                (&cand_items).into(),
                (&cand_counts).into(),
            ]);
            let grid = LaunchConfig {
                grid: (tiles as u32, in_group as u32, 1),
                ..LaunchConfig::blocks(1)
            };
            // SAFETY: the items and queries hold their rows (checked), with validity covering
            // them (a live count is at most the items' rows, the kernel reads no further); the
            // candidates hold `in_group * tiles` lists of `slots` entries and counts.
            unsafe { stream.launch(&tile_kernel, grid, &args)? };
            let (before, after) = (&self.best[now], &self.best[next]);
            let args = [
                (&cand_keys).into(),
                (&cand_items).into(),
                (&cand_counts).into(),
                KernelArg::U64(tiles as u64),
                KernelArg::U32(slots as u32),
                KernelArg::U64(first as u64),
                KernelArg::U32(self.k as u32),
                KernelArg::U32(self.stride as u32),
                (&before.keys).into(),
                (&before.items).into(),
                (&before.counts).into(),
                (&after.keys).into(),
                (&after.items).into(),
                (&after.counts).into(),
            ];
            // SAFETY: the candidates were written above for these `in_group` queries; both
            // running bests hold `stride` slots and a count for every query.
            unsafe { stream.launch(&merge, LaunchConfig::blocks(in_group as u32), &args)? };
            first += in_group;
        }
        self.current = next;
        Ok(())
    }

    /// Sorts each query's entries, nearest first, into the output columns. `query_base` is
    /// added to every query's position. One scan and one launch; nothing waits.
    pub fn finish(self, stream: &Stream, query_base: u64) -> Result<Nearest> {
        ensure_arg!(
            self.order == Order::Nearest,
            "the distances of a top-k kept in an SQL order (its keys hold NULLs)"
        );
        let bound = self.queries * self.k;
        let out = Nearest {
            query: stream.alloc(bound)?,
            item: stream.alloc(bound)?,
            rank: stream.alloc(bound)?,
            distance: stream.alloc(bound)?,
            count: stream.alloc_zeroed(1)?,
            bound,
        };
        if self.queries == 0 {
            return Ok(out);
        }
        let best = &self.best[self.current];
        let offsets = crate::scan::exclusive_sum_total_on_device::<u32>(
            stream,
            best.counts.as_slice(),
            out.count.as_slice(),
        )?;
        let kernel = stream.device().kernel("vector_topk_finish")?;
        let args = [
            (&best.keys).into(),
            (&best.items).into(),
            (&best.counts).into(),
            KernelArg::U32(self.stride as u32),
            KernelArg::U32(self.metric),
            KernelArg::U64(query_base),
            (&offsets).into(),
            (&out.query).into(),
            (&out.item).into(),
            (&out.rank).into(),
            (&out.distance).into(),
        ];
        // SAFETY: the running best holds `stride` slots and a count per query, each count at
        // most k; the offsets are their exclusive sum, so every row written is below
        // queries × k, the outputs' length.
        unsafe { stream.launch(&kernel, LaunchConfig::blocks(self.queries as u32), &args)? };
        Ok(out)
    }
}

impl NearestItems {
    /// The one query's entries as row indices, ascending, with their count on the device
    /// (one u32): the rows of the items added, when they were one batch, that a
    /// pre-selection keeps. One launch; nothing waits.
    pub fn rows(self, stream: &Stream) -> Result<(DeviceBuffer<u32>, DeviceBuffer<u32>)> {
        ensure_arg!(
            self.queries == 1,
            "the rows of {} queries' entries",
            self.queries
        );
        ensure_arg!(
            self.items <= u64::from(u32::MAX),
            "{} items pass a batch's u32 rows",
            self.items
        );
        let rows = stream.alloc::<u32>(self.k)?;
        let [first, second] = self.best;
        let best = if self.current == 0 { first } else { second };
        let kernel = stream.device().kernel("vector_topk_rows")?;
        let args = [
            (&best.items).into(),
            (&best.counts).into(),
            KernelArg::U32(self.stride as u32),
            (&rows).into(),
        ];
        // SAFETY: the running best holds `stride` slots and a count of at most k; `rows`
        // holds k indices.
        unsafe { stream.launch(&kernel, LaunchConfig::blocks(1), &args)? };
        // The other buffers are freed in the stream's order, after the launch.
        Ok((rows, best.counts))
    }
}

#[cfg(test)]
mod tests;
