//! TPC-H data from `tpchgen`: registered in memory, or written as Parquet files.
//!
//! Generation is deterministic for a scale factor, so the same SF always yields the same rows,
//! whether generated in memory or written to disk, and however many parts it is split into.
//! Fractional scale factors (e.g. 0.01) are supported. Strings come out as `Utf8View`.

use std::fs::File;
use std::path::{Path, PathBuf};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rayon::prelude::*;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow, RegionArrow,
    SupplierArrow,
};

use crate::engine::Engine;
use crate::error::{Result, SpateError};

/// Rows per generated batch.
const BATCH_ROWS: usize = 8192;

/// Rows per Parquet row group: small enough that a scan of one file splits across cores.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// The largest scale factor we accept (TPC-H's own largest official scale is 100,000).
const MAX_SCALE_FACTOR: f64 = 100_000.0;

/// The eight TPC-H tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TpchTable {
    /// `customer`: 150,000 × SF rows.
    Customer,
    /// `lineitem`: about 6,000,000 × SF rows.
    Lineitem,
    /// `nation`: 25 rows.
    Nation,
    /// `orders`: 1,500,000 × SF rows.
    Orders,
    /// `part`: 200,000 × SF rows.
    Part,
    /// `partsupp`: 800,000 × SF rows.
    Partsupp,
    /// `region`: 5 rows.
    Region,
    /// `supplier`: 10,000 × SF rows.
    Supplier,
}

type BatchIter = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>;

impl TpchTable {
    /// All tables, in alphabetical order.
    pub const ALL: [TpchTable; 8] = [
        TpchTable::Customer,
        TpchTable::Lineitem,
        TpchTable::Nation,
        TpchTable::Orders,
        TpchTable::Part,
        TpchTable::Partsupp,
        TpchTable::Region,
        TpchTable::Supplier,
    ];

    /// The table's SQL name.
    pub fn name(self) -> &'static str {
        match self {
            TpchTable::Customer => "customer",
            TpchTable::Lineitem => "lineitem",
            TpchTable::Nation => "nation",
            TpchTable::Orders => "orders",
            TpchTable::Part => "part",
            TpchTable::Partsupp => "partsupp",
            TpchTable::Region => "region",
            TpchTable::Supplier => "supplier",
        }
    }

    /// The table's Arrow schema.
    pub fn schema(self) -> SchemaRef {
        match self {
            TpchTable::Customer => CustomerArrow::schema_ref(),
            TpchTable::Lineitem => LineItemArrow::schema_ref(),
            TpchTable::Nation => NationArrow::schema_ref(),
            TpchTable::Orders => OrderArrow::schema_ref(),
            TpchTable::Part => PartArrow::schema_ref(),
            TpchTable::Partsupp => PartSuppArrow::schema_ref(),
            TpchTable::Region => RegionArrow::schema_ref(),
            TpchTable::Supplier => SupplierArrow::schema_ref(),
        }
    }

    /// Nation and region have fixed contents and cannot be split into parts.
    fn is_fixed(self) -> bool {
        matches!(self, TpchTable::Nation | TpchTable::Region)
    }

    /// The batches of one part (1-based) of `part_count`.
    fn batches(self, sf: f64, part: i32, part_count: i32) -> BatchIter {
        match self {
            TpchTable::Customer => Box::new(
                CustomerArrow::new(CustomerGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Lineitem => Box::new(
                LineItemArrow::new(LineItemGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Nation => Box::new(
                NationArrow::new(NationGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Orders => Box::new(
                OrderArrow::new(OrderGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Part => Box::new(
                PartArrow::new(PartGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Partsupp => Box::new(
                PartSuppArrow::new(PartSuppGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Region => Box::new(
                RegionArrow::new(RegionGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
            TpchTable::Supplier => Box::new(
                SupplierArrow::new(SupplierGenerator::new(sf, part, part_count))
                    .with_batch_size(BATCH_ROWS),
            ),
        }
    }

    /// Generates the table split into `parts` partitions, in parallel.
    pub fn generate(self, sf: f64, parts: usize) -> Result<Vec<Vec<RecordBatch>>> {
        check_scale_factor(sf)?;
        let parts = if self.is_fixed() { 1 } else { parts.max(1) };
        let part_count = i32::try_from(parts).map_err(|_| SpateError::Config {
            message: format!("too many TPC-H parts: {parts}"),
        })?;
        (1..=part_count)
            .into_par_iter()
            .map(|part| collect_part(self, sf, part, part_count))
            .collect()
    }
}

fn collect_part(table: TpchTable, sf: f64, part: i32, part_count: i32) -> Result<Vec<RecordBatch>> {
    table
        .batches(sf, part, part_count)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| SpateError::Internal {
            message: format!("tpchgen failed on {} part {part}: {e}", table.name()),
        })
}

/// Checks that `sf` is a usable scale factor.
pub fn check_scale_factor(sf: f64) -> Result<()> {
    if sf.is_finite() && sf > 0.0 && sf <= MAX_SCALE_FACTOR {
        Ok(())
    } else {
        Err(SpateError::Config {
            message: format!(
                "invalid TPC-H scale factor {sf}: expected a number above 0 and at most \
                 {MAX_SCALE_FACTOR}, e.g. 1 or 0.01"
            ),
        })
    }
}

/// Generates all eight tables in memory and registers them in `engine`, one partition per
/// target partition of the session.
pub fn register_tpch(engine: &Engine, sf: f64) -> Result<()> {
    check_scale_factor(sf)?;
    let parts = engine
        .context()
        .state()
        .config()
        .options()
        .execution
        .target_partitions;
    for table in TpchTable::ALL {
        let partitions = table.generate(sf, parts)?;
        engine.register_partitions(table.name(), table.schema(), partitions)?;
    }
    Ok(())
}

/// One Parquet file written by [`write_parquet`].
#[derive(Debug, Clone)]
pub struct WrittenTable {
    /// Which table.
    pub table: TpchTable,
    /// Where its file is.
    pub path: PathBuf,
    /// How many rows it holds.
    pub num_rows: usize,
}

/// Writes the eight tables as `<dir>/<table>.parquet`, creating `dir` if needed.
///
/// Each file is written under a temporary name and renamed when complete, so an interrupted
/// run never leaves a truncated file behind under the final name. `on_table` is called after
/// each table, e.g. to report progress.
pub fn write_parquet(
    sf: f64,
    dir: &Path,
    mut on_table: impl FnMut(&WrittenTable),
) -> Result<Vec<WrittenTable>> {
    check_scale_factor(sf)?;
    let io_error = |path: &Path, e: &dyn std::fmt::Display| SpateError::Source {
        path: path.display().to_string(),
        message: format!("cannot write: {e}"),
    };
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, &e))?;
    let threads = rayon::current_num_threads().max(1);
    // Parts bound memory: at most `threads` parts (about 1/ceil(sf) of a table each) are held
    // at once.
    let parts = threads * (sf.ceil() as usize).max(1);
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();

    let mut written = Vec::with_capacity(TpchTable::ALL.len());
    for table in TpchTable::ALL {
        let path = dir.join(format!("{}.parquet", table.name()));
        let partial = dir.join(format!(".{}.parquet.partial", table.name()));
        let file = File::create(&partial).map_err(|e| io_error(&partial, &e))?;
        let mut writer = ArrowWriter::try_new(file, table.schema(), Some(properties.clone()))
            .map_err(|e| io_error(&partial, &e))?;
        let part_count = if table.is_fixed() { 1 } else { parts };
        let part_numbers: Vec<i32> = (1..=part_count as i32).collect();
        let mut num_rows = 0;
        for chunk in part_numbers.chunks(threads) {
            let generated: Vec<Vec<RecordBatch>> = chunk
                .par_iter()
                .map(|&part| collect_part(table, sf, part, part_count as i32))
                .collect::<Result<_>>()?;
            for batch in generated.iter().flatten() {
                num_rows += batch.num_rows();
                writer.write(batch).map_err(|e| io_error(&partial, &e))?;
            }
        }
        writer.close().map_err(|e| io_error(&partial, &e))?;
        std::fs::rename(&partial, &path).map_err(|e| io_error(&path, &e))?;
        let entry = WrittenTable {
            table,
            path,
            num_rows,
        };
        on_table(&entry);
        written.push(entry);
    }
    Ok(written)
}

/// Registers the Parquet files written by [`write_parquet`] in `dir`.
pub async fn register_parquet_dir(engine: &Engine, dir: &Path) -> Result<()> {
    for table in TpchTable::ALL {
        let path = dir.join(format!("{}.parquet", table.name()));
        engine.register_parquet(table.name(), &path).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;

    use super::*;

    fn rows(partitions: &[Vec<RecordBatch>]) -> usize {
        partitions.iter().flatten().map(RecordBatch::num_rows).sum()
    }

    #[test]
    fn row_counts_do_not_depend_on_the_split() {
        let one = TpchTable::Orders.generate(0.01, 1).unwrap();
        let three = TpchTable::Orders.generate(0.01, 3).unwrap();
        assert_eq!(rows(&one), 15_000);
        assert_eq!(rows(&three), 15_000);
        assert_eq!(three.len(), 3);
        assert_eq!(TpchTable::Nation.generate(0.01, 4).unwrap().len(), 1);
    }

    #[test]
    fn bad_scale_factors_are_rejected() {
        for sf in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e9] {
            assert!(check_scale_factor(sf).is_err(), "{sf}");
        }
    }

    #[tokio::test]
    async fn parquet_and_memory_agree() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_parquet(0.01, dir.path(), |_| {}).unwrap();
        assert_eq!(written.len(), 8);
        let lineitem = written
            .iter()
            .find(|w| w.table == TpchTable::Lineitem)
            .unwrap();
        assert_eq!(lineitem.num_rows, 60_175);
        assert!(!dir.path().join(".lineitem.parquet.partial").exists());

        let query = "SELECT count(*), sum(l_orderkey) FROM lineitem";
        let on_disk = Engine::builder()
            .backend(crate::Backend::Cpu)
            .build()
            .unwrap();
        register_parquet_dir(&on_disk, dir.path()).await.unwrap();
        let in_memory = Engine::builder()
            .backend(crate::Backend::Cpu)
            .build()
            .unwrap();
        register_tpch(&in_memory, 0.01).unwrap();
        let a = on_disk.collect(query).await.unwrap();
        let b = in_memory.collect(query).await.unwrap();
        let value = |batches: &[RecordBatch], col: usize| {
            batches[0]
                .column(col)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0)
        };
        assert_eq!(value(&a, 0), 60_175);
        assert_eq!(value(&a, 0), value(&b, 0));
        assert_eq!(value(&a, 1), value(&b, 1));
    }
}
