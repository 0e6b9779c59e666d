//! `spate-bench`: the benchmark queries, the end-to-end runner ([`runner`]: run a query, see
//! where its operators ran, check its result against a reference), the TPC-H benchmark across
//! engines ([`suite`]) and its result files ([`report`]), and criterion micro-benchmarks per
//! kernel family (`benches/kernels.rs`). Other engines run beside Spate: [`duckdb`] times DuckDB over the
//! same Parquet files, and [`cells`] compares results across engines.
//!
//! The TPC-H query texts live in `benches/queries/tpch/qNN.sql` and are embedded here so that
//! tests and the runner use exactly the same SQL.
//!
//! ```
//! let q1 = spate_bench::tpch::query(1).unwrap();
//! assert!(q1.contains("lineitem"));
//! assert_eq!(spate_bench::tpch::QUERIES.len(), 22);
//! ```

pub mod cells;
pub mod compare;
pub mod datapath;
pub mod duckdb;
pub mod fraud;
pub mod report;
pub mod runner;
pub mod stream;
pub mod suite;
pub mod tpcds;
pub mod vector;
pub mod workload;

pub mod tpch {
    //! The 22 TPC-H queries with the specification's validation parameters.
    //!
    //! Q15's view is written as a common table expression so that each query is one statement.

    /// `(number, SQL)` for every query, in order.
    pub const QUERIES: [(usize, &str); 22] = [
        (1, include_str!("../queries/tpch/q01.sql")),
        (2, include_str!("../queries/tpch/q02.sql")),
        (3, include_str!("../queries/tpch/q03.sql")),
        (4, include_str!("../queries/tpch/q04.sql")),
        (5, include_str!("../queries/tpch/q05.sql")),
        (6, include_str!("../queries/tpch/q06.sql")),
        (7, include_str!("../queries/tpch/q07.sql")),
        (8, include_str!("../queries/tpch/q08.sql")),
        (9, include_str!("../queries/tpch/q09.sql")),
        (10, include_str!("../queries/tpch/q10.sql")),
        (11, include_str!("../queries/tpch/q11.sql")),
        (12, include_str!("../queries/tpch/q12.sql")),
        (13, include_str!("../queries/tpch/q13.sql")),
        (14, include_str!("../queries/tpch/q14.sql")),
        (15, include_str!("../queries/tpch/q15.sql")),
        (16, include_str!("../queries/tpch/q16.sql")),
        (17, include_str!("../queries/tpch/q17.sql")),
        (18, include_str!("../queries/tpch/q18.sql")),
        (19, include_str!("../queries/tpch/q19.sql")),
        (20, include_str!("../queries/tpch/q20.sql")),
        (21, include_str!("../queries/tpch/q21.sql")),
        (22, include_str!("../queries/tpch/q22.sql")),
    ];

    /// The SQL of query `number` (1–22).
    pub fn query(number: usize) -> Option<&'static str> {
        QUERIES
            .iter()
            .find(|(n, _)| *n == number)
            .map(|(_, sql)| *sql)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_query_is_one_statement() {
            for (n, sql) in QUERIES {
                let body = sql.trim_end();
                assert!(body.ends_with(';'), "q{n} must end with ';'");
                assert_eq!(body.matches(';').count(), 1, "q{n} must hold one statement");
            }
            assert!(query(0).is_none() && query(23).is_none());
        }
    }
}
