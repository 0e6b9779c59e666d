//! An aggregation past its share of the device budget: in stages (`staged.rs`), or, where
//! stages do not apply, partition by partition (`partitioned.rs`).

use super::partitioned::{self, Partitioned};
use super::staged::{self, Staged};
use crate::column::DeviceBatch;
use crate::error::Result;

/// An aggregation past its share of the budget: in stages, or partition by partition.
pub(super) enum Outgrown {
    Staged(Box<Staged>),
    Partitioned(Box<Partitioned>),
}

impl Outgrown {
    pub(super) fn push(&mut self, batch: &DeviceBatch) -> Result<()> {
        match self {
            Outgrown::Staged(s) => s.push(batch),
            Outgrown::Partitioned(p) => p.push(batch),
        }
    }

    pub(super) fn finish(self) -> Result<Finishing> {
        Ok(match self {
            Outgrown::Staged(s) => Finishing::Staged(Box::new(s.finish()?)),
            Outgrown::Partitioned(p) => Finishing::Partitioned(Box::new(p.finish())),
        })
    }
}

/// The output of an [`Outgrown`] aggregation, batch by batch.
pub(super) enum Finishing {
    Staged(Box<staged::Finishing>),
    Partitioned(Box<partitioned::Finishing>),
}

impl Finishing {
    pub(super) fn next_batch(&mut self) -> Result<Option<DeviceBatch>> {
        match self {
            Finishing::Staged(f) => f.next_batch(),
            Finishing::Partitioned(f) => f.next_batch(),
        }
    }
}
