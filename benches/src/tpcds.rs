//! TPC-DS: the 99 queries (`benches/queries/tpcds/`), and their data generated in process by
//! the `tpcdsgen` crate and written once per scale factor as Parquet.
//!
//! Four files (q14, q23, q24, q39) hold two statements each; each statement is a query of its
//! own, labelled `q14a` and `q14b`, so the suite runs 103 queries for the 99 templates.
//!
//! ```
//! let queries = spate_bench::tpcds::queries();
//! assert_eq!(queries.len(), 103);
//! assert_eq!(queries[0].label, "q01");
//! assert!(spate_bench::tpcds::query("q14b").unwrap().sql.contains("store_sales"));
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rayon::prelude::*;
use spate::Engine;
use tpcdsgen::config::{Session, SessionBuilder, Table as DsTable};
use tpcdsgen_arrow::{
    CallCenterArrow, CatalogPageArrow, CatalogReturnsArrow, CatalogSalesArrow,
    CustomerAddressArrow, CustomerArrow, CustomerDemographicsArrow, DateDimArrow,
    HouseholdDemographicsArrow, IncomeBandArrow, InventoryArrow, ItemArrow, PromotionArrow,
    ReasonArrow, ShipModeArrow, StoreArrow, StoreReturnsArrow, StoreSalesArrow, TimeDimArrow,
    WarehouseArrow, WebPageArrow, WebReturnsArrow, WebSalesArrow, WebSiteArrow,
};

/// `(template number, file text)` for the 99 query files, in order.
const FILES: [(usize, &str); 99] = [
    (1, include_str!("../queries/tpcds/q01.sql")),
    (2, include_str!("../queries/tpcds/q02.sql")),
    (3, include_str!("../queries/tpcds/q03.sql")),
    (4, include_str!("../queries/tpcds/q04.sql")),
    (5, include_str!("../queries/tpcds/q05.sql")),
    (6, include_str!("../queries/tpcds/q06.sql")),
    (7, include_str!("../queries/tpcds/q07.sql")),
    (8, include_str!("../queries/tpcds/q08.sql")),
    (9, include_str!("../queries/tpcds/q09.sql")),
    (10, include_str!("../queries/tpcds/q10.sql")),
    (11, include_str!("../queries/tpcds/q11.sql")),
    (12, include_str!("../queries/tpcds/q12.sql")),
    (13, include_str!("../queries/tpcds/q13.sql")),
    (14, include_str!("../queries/tpcds/q14.sql")),
    (15, include_str!("../queries/tpcds/q15.sql")),
    (16, include_str!("../queries/tpcds/q16.sql")),
    (17, include_str!("../queries/tpcds/q17.sql")),
    (18, include_str!("../queries/tpcds/q18.sql")),
    (19, include_str!("../queries/tpcds/q19.sql")),
    (20, include_str!("../queries/tpcds/q20.sql")),
    (21, include_str!("../queries/tpcds/q21.sql")),
    (22, include_str!("../queries/tpcds/q22.sql")),
    (23, include_str!("../queries/tpcds/q23.sql")),
    (24, include_str!("../queries/tpcds/q24.sql")),
    (25, include_str!("../queries/tpcds/q25.sql")),
    (26, include_str!("../queries/tpcds/q26.sql")),
    (27, include_str!("../queries/tpcds/q27.sql")),
    (28, include_str!("../queries/tpcds/q28.sql")),
    (29, include_str!("../queries/tpcds/q29.sql")),
    (30, include_str!("../queries/tpcds/q30.sql")),
    (31, include_str!("../queries/tpcds/q31.sql")),
    (32, include_str!("../queries/tpcds/q32.sql")),
    (33, include_str!("../queries/tpcds/q33.sql")),
    (34, include_str!("../queries/tpcds/q34.sql")),
    (35, include_str!("../queries/tpcds/q35.sql")),
    (36, include_str!("../queries/tpcds/q36.sql")),
    (37, include_str!("../queries/tpcds/q37.sql")),
    (38, include_str!("../queries/tpcds/q38.sql")),
    (39, include_str!("../queries/tpcds/q39.sql")),
    (40, include_str!("../queries/tpcds/q40.sql")),
    (41, include_str!("../queries/tpcds/q41.sql")),
    (42, include_str!("../queries/tpcds/q42.sql")),
    (43, include_str!("../queries/tpcds/q43.sql")),
    (44, include_str!("../queries/tpcds/q44.sql")),
    (45, include_str!("../queries/tpcds/q45.sql")),
    (46, include_str!("../queries/tpcds/q46.sql")),
    (47, include_str!("../queries/tpcds/q47.sql")),
    (48, include_str!("../queries/tpcds/q48.sql")),
    (49, include_str!("../queries/tpcds/q49.sql")),
    (50, include_str!("../queries/tpcds/q50.sql")),
    (51, include_str!("../queries/tpcds/q51.sql")),
    (52, include_str!("../queries/tpcds/q52.sql")),
    (53, include_str!("../queries/tpcds/q53.sql")),
    (54, include_str!("../queries/tpcds/q54.sql")),
    (55, include_str!("../queries/tpcds/q55.sql")),
    (56, include_str!("../queries/tpcds/q56.sql")),
    (57, include_str!("../queries/tpcds/q57.sql")),
    (58, include_str!("../queries/tpcds/q58.sql")),
    (59, include_str!("../queries/tpcds/q59.sql")),
    (60, include_str!("../queries/tpcds/q60.sql")),
    (61, include_str!("../queries/tpcds/q61.sql")),
    (62, include_str!("../queries/tpcds/q62.sql")),
    (63, include_str!("../queries/tpcds/q63.sql")),
    (64, include_str!("../queries/tpcds/q64.sql")),
    (65, include_str!("../queries/tpcds/q65.sql")),
    (66, include_str!("../queries/tpcds/q66.sql")),
    (67, include_str!("../queries/tpcds/q67.sql")),
    (68, include_str!("../queries/tpcds/q68.sql")),
    (69, include_str!("../queries/tpcds/q69.sql")),
    (70, include_str!("../queries/tpcds/q70.sql")),
    (71, include_str!("../queries/tpcds/q71.sql")),
    (72, include_str!("../queries/tpcds/q72.sql")),
    (73, include_str!("../queries/tpcds/q73.sql")),
    (74, include_str!("../queries/tpcds/q74.sql")),
    (75, include_str!("../queries/tpcds/q75.sql")),
    (76, include_str!("../queries/tpcds/q76.sql")),
    (77, include_str!("../queries/tpcds/q77.sql")),
    (78, include_str!("../queries/tpcds/q78.sql")),
    (79, include_str!("../queries/tpcds/q79.sql")),
    (80, include_str!("../queries/tpcds/q80.sql")),
    (81, include_str!("../queries/tpcds/q81.sql")),
    (82, include_str!("../queries/tpcds/q82.sql")),
    (83, include_str!("../queries/tpcds/q83.sql")),
    (84, include_str!("../queries/tpcds/q84.sql")),
    (85, include_str!("../queries/tpcds/q85.sql")),
    (86, include_str!("../queries/tpcds/q86.sql")),
    (87, include_str!("../queries/tpcds/q87.sql")),
    (88, include_str!("../queries/tpcds/q88.sql")),
    (89, include_str!("../queries/tpcds/q89.sql")),
    (90, include_str!("../queries/tpcds/q90.sql")),
    (91, include_str!("../queries/tpcds/q91.sql")),
    (92, include_str!("../queries/tpcds/q92.sql")),
    (93, include_str!("../queries/tpcds/q93.sql")),
    (94, include_str!("../queries/tpcds/q94.sql")),
    (95, include_str!("../queries/tpcds/q95.sql")),
    (96, include_str!("../queries/tpcds/q96.sql")),
    (97, include_str!("../queries/tpcds/q97.sql")),
    (98, include_str!("../queries/tpcds/q98.sql")),
    (99, include_str!("../queries/tpcds/q99.sql")),
];

/// One TPC-DS query: one statement of a template's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    /// `q01` … `q99`, with `a`/`b` for the second statement of q14, q23, q24 and q39.
    pub label: &'static str,
    /// The statement, ending with `;`.
    pub sql: &'static str,
}

/// Every query, in template order (103 statements).
pub fn queries() -> Vec<Query> {
    static QUERIES: std::sync::LazyLock<Vec<Query>> = std::sync::LazyLock::new(|| {
        let mut out = Vec::with_capacity(103);
        for (number, text) in FILES {
            // No TPC-DS statement holds a `;` inside a literal, so a `;` ends a statement.
            let statements: Vec<&'static str> = text
                .split_inclusive(';')
                .map(str::trim)
                .filter(|s| s.len() > 1)
                .collect();
            for (k, sql) in statements.iter().enumerate() {
                let suffix = match (statements.len(), k) {
                    (1, _) => "",
                    (_, 0) => "a",
                    (_, 1) => "b",
                    _ => "c",
                };
                let label: &'static str = format!("q{number:02}{suffix}").leak();
                out.push(Query { label, sql });
            }
        }
        out
    });
    QUERIES.clone()
}

/// The query labelled `label` (`q03`, `q14a`), or the queries of a template number given as
/// `q14`/`14`.
pub fn query(label: &str) -> Option<Query> {
    queries().into_iter().find(|q| q.label == label)
}

/// The queries of template `number` (1–99): one, or two for q14, q23, q24 and q39.
pub fn template(number: usize) -> Vec<Query> {
    let prefix = format!("q{number:02}");
    queries()
        .into_iter()
        .filter(|q| q.label.strip_prefix(&prefix).is_some_and(|s| s.len() <= 1))
        .collect()
}

/// Rows per generated batch.
const BATCH_ROWS: usize = 8192;

/// Rows per Parquet row group: several per file at SF 1, so scans split.
const ROW_GROUP_ROWS: usize = 128 * 1024;

type Batches = Box<dyn RecordBatchReader + Send>;

/// One TPC-DS table: its name, the generator's table, and its generator for a session and a
/// range of source rows (1-based, inclusive).
#[derive(Clone, Copy)]
struct TableGen {
    name: &'static str,
    table: DsTable,
    generate: fn(Session, u64, u64) -> Batches,
}

macro_rules! tables {
    ($($name:literal: $table:ident => $arrow:ident),* $(,)?) => {
        /// The 24 tables the queries read (`dbgen_version` is left out).
        const TABLES: &[TableGen] = &[$(
            TableGen {
                name: $name,
                table: DsTable::$table,
                generate: |session, first, last| {
                    Box::new(
                        $arrow::new(session)
                            .with_source_row_range(first, last)
                            .with_batch_size(BATCH_ROWS),
                    )
                },
            },
        )*];
    };
}

tables! {
    "call_center": CallCenter => CallCenterArrow,
    "catalog_page": CatalogPage => CatalogPageArrow,
    "catalog_returns": CatalogReturns => CatalogReturnsArrow,
    "catalog_sales": CatalogSales => CatalogSalesArrow,
    "customer": Customer => CustomerArrow,
    "customer_address": CustomerAddress => CustomerAddressArrow,
    "customer_demographics": CustomerDemographics => CustomerDemographicsArrow,
    "date_dim": DateDim => DateDimArrow,
    "household_demographics": HouseholdDemographics => HouseholdDemographicsArrow,
    "income_band": IncomeBand => IncomeBandArrow,
    "inventory": Inventory => InventoryArrow,
    "item": Item => ItemArrow,
    "promotion": Promotion => PromotionArrow,
    "reason": Reason => ReasonArrow,
    "ship_mode": ShipMode => ShipModeArrow,
    "store": Store => StoreArrow,
    "store_returns": StoreReturns => StoreReturnsArrow,
    "store_sales": StoreSales => StoreSalesArrow,
    "time_dim": TimeDim => TimeDimArrow,
    "warehouse": Warehouse => WarehouseArrow,
    "web_page": WebPage => WebPageArrow,
    "web_returns": WebReturns => WebReturnsArrow,
    "web_sales": WebSales => WebSalesArrow,
    "web_site": WebSite => WebSiteArrow,
}

/// The names of the 24 tables, in the order they are generated.
pub fn table_names() -> impl Iterator<Item = &'static str> {
    TABLES.iter().map(|t| t.name)
}

fn session(sf: f64) -> Result<Session, String> {
    if !(sf.is_finite() && sf > 0.0) {
        return Err(format!(
            "the TPC-DS scale factor must be a positive number, not {sf}"
        ));
    }
    SessionBuilder::new()
        .with_scale_factor(sf)
        .build()
        .map_err(|e| format!("TPC-DS SF {sf}: {e}"))
}

/// The rows of `table` from source rows `first..=last`.
fn generate_range(
    table: &TableGen,
    sf: f64,
    first: u64,
    last: u64,
) -> Result<Vec<RecordBatch>, String> {
    let batches = (table.generate)(session(sf)?, first, last);
    batches
        .collect::<Result<Vec<_>, ArrowError>>()
        .map_err(|e| format!("generating TPC-DS {}: {e}", table.name))
}

/// Source rows `1..=rows` cut into `parts` ranges, in order.
fn ranges(rows: u64, parts: u64) -> Vec<(u64, u64)> {
    let parts = parts.clamp(1, rows.max(1));
    (0..parts)
        .map(|k| (rows * k / parts + 1, rows * (k + 1) / parts))
        .filter(|(first, last)| first <= last)
        .collect()
}

/// The schema of `table`'s generator.
fn schema_of(table: &TableGen, sf: f64) -> Result<SchemaRef, String> {
    Ok((table.generate)(session(sf)?, 1, 1).schema())
}

/// Writes the 24 tables as `<dir>/<table>.parquet`, each table's source rows generated in
/// parallel ranges, and calls `on_table(name, rows)` after each. A file is written under a
/// temporary name and renamed when complete, so an interrupted run leaves no truncated file.
pub fn write_parquet(
    sf: f64,
    dir: &Path,
    mut on_table: impl FnMut(&str, usize),
) -> Result<Vec<PathBuf>, String> {
    let io = |path: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(|e| io(dir, &e))?;
    let threads = rayon::current_num_threads().max(1) as u64;
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let scaling = session(sf)?;
    let mut written = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let path = dir.join(format!("{}.parquet", table.name));
        let partial = dir.join(format!(".{}.parquet.partial", table.name));
        let file = File::create(&partial).map_err(|e| io(&partial, &e))?;
        let mut writer =
            ArrowWriter::try_new(file, schema_of(table, sf)?, Some(properties.clone()))
                .map_err(|e| io(&partial, &e))?;
        let rows = scaling.get_scaling().get_row_count(table.table);
        // Parts bound memory: `threads` of them are held at once.
        let parts = ranges(rows, threads * (sf.ceil() as u64).max(1) * 2);
        let mut num_rows = 0;
        for chunk in parts.chunks(threads as usize) {
            let generated: Vec<Vec<RecordBatch>> = chunk
                .par_iter()
                .map(|(first, last)| generate_range(table, sf, *first, *last))
                .collect::<Result<_, String>>()?;
            for batch in generated.iter().flatten() {
                num_rows += batch.num_rows();
                writer.write(batch).map_err(|e| io(&partial, &e))?;
            }
        }
        writer.close().map_err(|e| io(&partial, &e))?;
        std::fs::rename(&partial, &path).map_err(|e| io(&path, &e))?;
        on_table(table.name, num_rows);
        written.push(path);
    }
    Ok(written)
}

/// Generates the TPC-DS Parquet files in `dir` unless a complete set for `sf` is there.
pub fn ensure_data(sf: f64, dir: &Path, log: &mut dyn FnMut(&str)) -> Result<(), String> {
    let marker = dir.join(".complete");
    let want = format!("tpcds sf {sf}\n");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        log(&format!(
            "reusing TPC-DS SF {sf} Parquet in {}",
            crate::suite::shown_dir(dir).display()
        ));
        return Ok(());
    }
    log(&format!(
        "generating TPC-DS SF {sf} Parquet in {}",
        crate::suite::shown_dir(dir).display()
    ));
    let started = Instant::now();
    write_parquet(sf, dir, |_, _| {})?;
    std::fs::write(&marker, want).map_err(|e| format!("{}: {e}", marker.display()))?;
    log(&format!(
        "generated in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Registers the Parquet files of [`write_parquet`] in `dir` as the 24 tables.
pub async fn register_parquet_dir(engine: &Engine, dir: &Path) -> Result<(), String> {
    for name in table_names() {
        let path = dir.join(format!("{name}.parquet"));
        engine
            .register_parquet(name, &path)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_gives_its_statements() {
        let all = queries();
        assert_eq!(all.len(), 103);
        for number in 1..=99 {
            let want = if [14, 23, 24, 39].contains(&number) {
                2
            } else {
                1
            };
            let got = template(number);
            assert_eq!(got.len(), want, "q{number}");
            for q in got {
                assert!(q.sql.ends_with(';'), "{}", q.label);
                assert_eq!(q.sql.matches(';').count(), 1, "{}", q.label);
                assert!(q.sql.to_ascii_lowercase().contains("select"), "{}", q.label);
            }
        }
        assert_eq!(query("q14a").unwrap().label, "q14a");
        assert!(query("q14").is_none() && query("q100").is_none());
    }

    #[test]
    fn ranges_cover_every_row_once() {
        for (rows, parts) in [(0u64, 4u64), (1, 4), (7, 3), (100, 7), (5, 1)] {
            let r = ranges(rows, parts);
            let covered: u64 = r.iter().map(|(f, l)| l - f + 1).sum();
            assert_eq!(covered, rows, "{rows} in {parts}");
            for w in r.windows(2) {
                assert_eq!(w[0].1 + 1, w[1].0);
            }
        }
    }

    /// Cutting a table's source rows into ranges generates the same rows as one range.
    #[test]
    fn ranges_generate_what_one_range_does() {
        let sf = 0.01;
        let scaling = session(sf).unwrap();
        for table in TABLES.iter().filter(|t| {
            [
                "store_sales",
                "store_returns",
                "customer",
                "inventory",
                "date_dim",
            ]
            .contains(&t.name)
        }) {
            let rows = scaling.get_scaling().get_row_count(table.table).min(3000);
            let whole = generate_range(table, sf, 1, rows).unwrap();
            let parts: Vec<RecordBatch> = ranges(rows, 3)
                .iter()
                .flat_map(|(f, l)| generate_range(table, sf, *f, *l).unwrap())
                .collect();
            let schema = whole[0].schema();
            let whole = arrow::compute::concat_batches(&schema, &whole).unwrap();
            let parts = arrow::compute::concat_batches(&schema, &parts).unwrap();
            assert_eq!(whole, parts, "{}", table.name);
        }
    }
}
