//! Stream-to-stream interval joins: how far apart the event times of the rows a join of two
//! streams pairs may be.
//!
//! A continuous view that joins the rows of two streams must bound their times against each
//! other in its condition, such as
//! `p.ts BETWEEN c.ts - INTERVAL '2' SECOND AND c.ts + INTERVAL '3' SECOND` (or with `>=`, `<=`,
//! `<`, `>` and `=`). From the bound `M` (here 3 s, the larger distance either way) the view
//! knows two things (`view.rs`):
//! - an output row is final once the watermark is `M` past its time, since a row of the other
//!   stream up to `M` later may still pair with it;
//! - each stream keeps its rows `M` behind the final bound, the oldest a row still to come may
//!   pair with.
//!
//! A join of two streams without such a bound is refused: every row would have to be kept,
//! and no output row would ever be final.

use datafusion::common::Column;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, Join, LogicalPlan, Operator};

use super::interval::interval_expr_micros;
use super::state::StreamTable;
use crate::error::{Result, SpateError};

/// Which side's time column a column is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// `column ± interval`: the column and the offset in microseconds.
fn term(e: &Expr) -> Option<(&Column, i64)> {
    match e {
        Expr::Column(c) => Some((c, 0)),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let Expr::Column(c) = left.as_ref() else {
                return None;
            };
            let micros = interval_expr_micros(right, "a join's time bound").ok()?;
            match op {
                Operator::Plus => Some((c, micros)),
                Operator::Minus => Some((c, -micros)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The least and greatest `right time - left time` the join's condition allows, in
/// microseconds (`None`: unbounded that way).
#[derive(Debug, Default)]
struct Bounds {
    low: Option<i64>,
    high: Option<i64>,
}

impl Bounds {
    fn at_least(&mut self, v: i64) {
        self.low = Some(self.low.map_or(v, |l| l.max(v)));
    }

    fn at_most(&mut self, v: i64) {
        self.high = Some(self.high.map_or(v, |h| h.min(v)));
    }

    /// `a op b`, where each is a time column of one side plus an offset.
    fn add(&mut self, a: (Side, i64), op: Operator, b: (Side, i64)) {
        // With d = right - left: `right + x op left + y` is `d op y - x`, and
        // `left + x op right + y` is `d op' x - y` with the comparison turned round.
        let (op, v) = match (a.0, b.0) {
            (Side::Right, Side::Left) => (op, b.1 - a.1),
            (Side::Left, Side::Right) => match op.swap() {
                Some(swapped) => (swapped, a.1 - b.1),
                None => return,
            },
            _ => return,
        };
        match op {
            Operator::Gt | Operator::GtEq => self.at_least(v),
            Operator::Lt | Operator::LtEq => self.at_most(v),
            Operator::Eq => {
                self.at_least(v);
                self.at_most(v);
            }
            _ => {}
        }
    }
}

/// Whether `plan` outputs `c` as a stream's time column, as the stream has it: through
/// aliases, filters, joins and projections that pass it on as it is (a column computed, even
/// under the time column's name, is not one).
fn is_stream_time(plan: &LogicalPlan, c: &Column) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => source_as_provider(&scan.source)
            .ok()
            .and_then(|p| {
                p.downcast_ref::<StreamTable>().map(|t| {
                    let config = &t.stream.config;
                    config.schema.field(config.time_column).name() == &c.name
                })
            })
            .unwrap_or(false),
        LogicalPlan::SubqueryAlias(a) => is_stream_time(&a.input, &Column::from_name(&c.name)),
        LogicalPlan::Filter(f) => is_stream_time(&f.input, c),
        LogicalPlan::Projection(p) => p.expr.iter().zip(p.schema.iter()).any(|(e, (q, f))| {
            f.name() == &c.name
                && (c.relation.is_none() || q == c.relation.as_ref())
                && matches!(e, Expr::Column(inner) if inner.name == c.name
                    && is_stream_time(&p.input, inner))
        }),
        LogicalPlan::Join(j) => [&j.left, &j.right]
            .iter()
            .any(|side| side.schema().has_column(c) && is_stream_time(side, c)),
        _ => false,
    }
}

/// How far apart (in microseconds) the times of the rows `join` (of two streams' rows) pairs
/// may be; an error when its condition does not bound them both ways.
pub(crate) fn time_bound(join: &Join) -> Result<i64> {
    let side = |c: &Column| -> Option<Side> {
        if join.left.schema().has_column(c) && is_stream_time(&join.left, c) {
            Some(Side::Left)
        } else if join.right.schema().has_column(c) && is_stream_time(&join.right, c) {
            Some(Side::Right)
        } else {
            None
        }
    };
    let timed = |e: &Expr| term(e).and_then(|(c, offset)| side(c).map(|s| (s, offset)));
    let mut bounds = Bounds::default();
    let mut conjuncts: Vec<Expr> = join
        .on
        .iter()
        .map(|(l, r)| l.clone().eq(r.clone()))
        .collect();
    if let Some(filter) = &join.filter {
        conjuncts.extend(split_conjunction(filter).into_iter().cloned());
    }
    for e in &conjuncts {
        match e {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                if let (Some(a), Some(b)) = (timed(left), timed(right)) {
                    bounds.add(a, *op, b);
                }
            }
            Expr::Between(between) if !between.negated => {
                if let (Some(x), Some(low), Some(high)) = (
                    timed(&between.expr),
                    timed(&between.low),
                    timed(&between.high),
                ) {
                    bounds.add(x, Operator::GtEq, low);
                    bounds.add(x, Operator::LtEq, high);
                }
            }
            _ => {}
        }
    }
    match (bounds.low, bounds.high) {
        (Some(low), Some(high)) => Ok(low.abs().max(high.abs())),
        _ => Err(SpateError::Unsupported {
            message: "a continuous view that joins two streams must bound their times against \
                      each other, e.g. `ON b.k = a.k AND b.ts BETWEEN a.ts - INTERVAL '5' \
                      SECOND AND a.ts + INTERVAL '5' SECOND`: otherwise every row is kept and \
                      no joined row is ever final"
                .into(),
        }),
    }
}
