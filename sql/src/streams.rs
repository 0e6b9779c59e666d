//! The shell's streaming commands: `\streams` (each stream's watermark, lag, late rows and
//! views) and `SUBSCRIBE view` (print what a continuous view emits, until Ctrl-C).

use comfy_table::Table;
use spate::{Engine, StreamInfo};

use crate::session::TABLE_STYLE;

/// `SUBSCRIBE name` (an optional `;` after): the view's name.
pub fn subscribe_target(text: &str) -> Option<String> {
    let text = text.trim().trim_end_matches(';').trim_end();
    let mut words = text.split_whitespace();
    let first = words.next()?;
    if !first.eq_ignore_ascii_case("SUBSCRIBE") {
        return None;
    }
    let name = words.next()?;
    if words.next().is_some() {
        return None;
    }
    Some(name.trim_matches('"').to_string())
}

fn time(micros: Option<i64>) -> String {
    match micros {
        None => "-".into(),
        Some(i64::MAX) => "end of stream".into(),
        Some(m) => arrow::temporal_conversions::timestamp_us_to_datetime(m)
            .map_or_else(|| m.to_string(), |t| t.to_string()),
    }
}

fn row(s: &StreamInfo) -> Vec<String> {
    vec![
        s.name.clone(),
        s.time_column.clone(),
        time(s.watermark_micros),
        s.lag_micros
            .map_or("-".into(), |l| format!("{:.3} s", l as f64 / 1e6)),
        s.events.to_string(),
        s.late_rows.to_string(),
        s.micro_batches.to_string(),
        s.waiting_rows.to_string(),
        format!(
            "{} ({:.1} MiB)",
            s.kept_rows,
            s.kept_bytes as f64 / 1_048_576.0
        ),
        if s.views.is_empty() {
            "-".into()
        } else {
            s.views
                .iter()
                .map(|v| match s.pane_rows.iter().find(|(p, _)| p == v) {
                    Some((_, rows)) => format!("{v} (panes: {rows} rows)"),
                    None => v.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        },
    ]
}

/// `\streams`: one row per stream.
pub fn streams_table(engine: &Engine) -> String {
    let streams = engine.streams();
    if streams.is_empty() {
        return "No streams (CREATE STREAM name (…, WATERMARK FOR ts AS ts - INTERVAL '5' \
                SECOND) makes one)."
            .into();
    }
    let mut table = Table::new();
    table.load_preset(TABLE_STYLE);
    table.set_header([
        "stream",
        "time",
        "watermark",
        "lag",
        "events",
        "late",
        "micro-batches",
        "waiting",
        "kept rows",
        "views",
    ]);
    for s in &streams {
        table.add_row(row(s));
    }
    table.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribe_takes_one_name() {
        assert_eq!(subscribe_target("SUBSCRIBE v;"), Some("v".into()));
        assert_eq!(subscribe_target("  subscribe \"V\"  "), Some("V".into()));
        assert_eq!(subscribe_target("SUBSCRIBE"), None);
        assert_eq!(subscribe_target("SUBSCRIBE a b"), None);
        assert_eq!(subscribe_target("SELECT 1"), None);
    }
}
