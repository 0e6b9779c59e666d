//! Spate's own statements and clauses, rewritten before parsing into statements DataFusion's
//! parser reads:
//!
//! - `CACHE TABLE t SHARDED BY (a, b)` becomes `CACHE TABLE t OPTIONS ('spate.sharded_by' =
//!   'a,b')`;
//! - `CREATE STREAM tx (…, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) [WITH (…)]` becomes
//!   `CREATE TABLE tx (…) WITH (spate_stream = 'ts', spate_watermark_delay = '5000000', …)`;
//! - `CREATE CONTINUOUS VIEW v [WITH (…)] AS SELECT … [EMIT ON WINDOW CLOSE | EMIT ON UPDATE]`
//!   becomes `CREATE VIEW v WITH (spate_emit = 'close', …) AS SELECT …`.
//!
//! - `CHECKPOINT 'folder'` and `RESTORE 'folder'` become `SET spate_checkpoint = 'folder'` and
//!   `SET spate_restore = 'folder'`.
//! - `a <-> b`, PostgreSQL's (pgvector's) Euclidean distance, becomes `array_distance(a, b)`
//!   when `a` is a column (`t.emb`) or an array literal and `b` is a column, an array literal
//!   (`[1, 2]`, `ARRAY[1, 2]`) or pgvector's text form of one (`'[1, 2]'`); other operands are
//!   left to the parser, which reports them.
//!
//! The engine then recognises the options (`Engine::execute_statement`, `stream::Catalog`) and
//! shards the cache, or creates a stream or a continuous view instead of a table or a view. The
//! rewrite works on the dialect's tokens and splices the original text, so quoting, comments
//! and everything else in the statement survive as written. Text that does not tokenize is
//! returned as it is, for the parser to report.

use std::borrow::Cow;

use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::error::{Result, SpateError};
use crate::stream::interval::parse_duration_micros;

/// The option `CACHE TABLE t SHARDED BY (a, b)` becomes (the SQL parser has no such clause,
/// and has `OPTIONS`).
pub const SHARDED_BY_OPTION: &str = "spate.sharded_by";
/// The option naming a stream's event-time column (its presence makes a table a stream).
pub const STREAM_OPTION: &str = "spate_stream";
/// The option holding a stream's watermark delay, in microseconds.
pub const DELAY_OPTION: &str = "spate_watermark_delay";
/// The option making a view continuous, with its emit mode (`close` or `update`).
pub const EMIT_OPTION: &str = "spate_emit";
/// `CHECKPOINT 'folder'` becomes `SET spate_checkpoint = 'folder'`.
pub const CHECKPOINT_VARIABLE: &str = "spate_checkpoint";
/// `RESTORE 'folder'` becomes `SET spate_restore = 'folder'`.
pub const RESTORE_VARIABLE: &str = "spate_restore";

/// The tokens of a SQL text, with byte offsets back into it.
struct Tokens<'a> {
    sql: &'a str,
    tokens: Vec<TokenWithSpan>,
    line_starts: Vec<usize>,
}

impl<'a> Tokens<'a> {
    fn new(sql: &'a str, dialect: &dyn Dialect) -> Option<Self> {
        let tokens = Tokenizer::new(dialect, sql)
            .with_unescape(false)
            .tokenize_with_location()
            .ok()?;
        let line_starts = std::iter::once(0)
            .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Some(Tokens {
            sql,
            tokens,
            line_starts,
        })
    }

    /// The byte offset of a location (lines and columns count from 1, columns in chars).
    fn offset(&self, at: Location) -> Option<usize> {
        let start = *self
            .line_starts
            .get(usize::try_from(at.line).ok()?.checked_sub(1)?)?;
        let column = usize::try_from(at.column).ok()?.checked_sub(1)?;
        Some(match self.sql[start..].char_indices().nth(column) {
            Some((i, _)) => start + i,
            None => self.sql.len(),
        })
    }

    fn start(&self, i: usize) -> Option<usize> {
        self.offset(self.tokens[i].span.start)
    }

    fn end(&self, i: usize) -> Option<usize> {
        self.offset(self.tokens[i].span.end)
    }

    /// Whether `<->` starts at token `i`: `<` followed at once by `->`.
    fn is_distance_operator(&self, i: usize) -> bool {
        matches!(self.tokens[i].token, Token::Lt)
            && self
                .tokens
                .get(i + 1)
                .is_some_and(|n| matches!(n.token, Token::Arrow))
            && self.end(i).is_some()
            && self.end(i) == self.start(i + 1)
    }

    fn is_word(&self, i: usize, word: &str) -> bool {
        matches!(&self.tokens[i].token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
    }
}

fn sql_error(message: String) -> SpateError {
    SpateError::Sql {
        message,
        location: None,
    }
}

/// Rewrites Spate's statements and clauses in `sql` (see the module docs); other text is
/// returned as it is.
pub fn rewrite<'a>(sql: &'a str, dialect: &dyn Dialect) -> Result<Cow<'a, str>> {
    let Some(t) = Tokens::new(sql, dialect) else {
        return Ok(sql.into());
    };
    let interesting = (0..t.tokens.len()).any(|i| {
        ["SHARDED", "STREAM", "CONTINUOUS", "CHECKPOINT", "RESTORE"]
            .iter()
            .any(|w| t.is_word(i, w))
            || t.is_distance_operator(i)
    });
    if !interesting {
        return Ok(sql.into());
    }
    // Each statement's significant tokens, split at semicolons.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut statement: Vec<usize> = Vec::new();
    for i in 0..=t.tokens.len() {
        let end = i == t.tokens.len() || matches!(t.tokens[i].token, Token::SemiColon | Token::EOF);
        if end {
            rewrite_statement(&t, &statement, &mut edits)?;
            statement.clear();
            if i == t.tokens.len() {
                break;
            }
            continue;
        }
        if !matches!(t.tokens[i].token, Token::Whitespace(_)) {
            statement.push(i);
        }
    }
    if edits.is_empty() {
        return Ok(sql.into());
    }
    edits.sort_by_key(|e| (e.0, e.1));
    let mut out = String::with_capacity(sql.len() + 64);
    let mut at = 0;
    for (start, end, replacement) in edits {
        if start < at || end < start {
            return Err(SpateError::Internal {
                message: "overlapping edits in a rewritten statement".into(),
            });
        }
        out.push_str(&sql[at..start]);
        out.push_str(&replacement);
        at = end;
    }
    out.push_str(&sql[at..]);
    Ok(out.into())
}

/// The edits that turn one statement (its significant token indices) into DataFusion's SQL.
fn rewrite_statement(
    t: &Tokens<'_>,
    sig: &[usize],
    edits: &mut Vec<(usize, usize, String)>,
) -> Result<()> {
    distance_operators(t, sig, edits);
    let word = |k: usize, w: &str| sig.get(k).is_some_and(|&i| t.is_word(i, w));
    for (command, variable) in [
        ("CHECKPOINT", CHECKPOINT_VARIABLE),
        ("RESTORE", RESTORE_VARIABLE),
    ] {
        if word(0, command) {
            let folder = match sig.get(1).map(|&i| &t.tokens[i].token) {
                Some(Token::SingleQuotedString(folder)) if sig.len() == 2 => folder.clone(),
                _ => return Err(sql_error(format!("write {command} 'folder'"))),
            };
            let (start, end) = match (t.start(sig[0]), t.end(sig[1])) {
                (Some(s), Some(e)) => (s, e),
                _ => {
                    return Err(SpateError::Internal {
                        message: format!("a token without a location in {command}"),
                    });
                }
            };
            // The folder is passed through as written (quotes doubled inside stay doubled).
            edits.push((start, end, format!("SET {variable} = '{folder}'")));
            return Ok(());
        }
    }
    if word(0, "CACHE") {
        return sharded_by(t, sig, edits);
    }
    if !word(0, "CREATE") {
        return Ok(());
    }
    let kind = if word(1, "OR") && word(2, "REPLACE") {
        3
    } else {
        1
    };
    if word(kind, "STREAM") {
        create_stream(t, sig, kind, edits)
    } else if word(kind, "CONTINUOUS") && word(kind + 1, "VIEW") {
        create_continuous_view(t, sig, kind, edits)
    } else {
        Ok(())
    }
}

/// `a <-> b` → `array_distance(a, b)`, for the operands the module docs name.
fn distance_operators(t: &Tokens<'_>, sig: &[usize], edits: &mut Vec<(usize, usize, String)>) {
    let is = |k: usize, f: fn(&Token) -> bool| sig.get(k).is_some_and(|&i| f(&t.tokens[i].token));
    let word = |tok: &Token| matches!(tok, Token::Word(_));
    // The significant token after the last edit: operands may not reach back before it.
    let mut free = 0;
    let mut k = 1;
    while k + 1 < sig.len() {
        if !t.is_distance_operator(sig[k]) || sig.get(k + 1) != Some(&(sig[k] + 1)) {
            k += 1;
            continue;
        }
        // The left operand: `[ … ]`, or words joined by periods, ending at k - 1.
        let first = if is(k - 1, |tok| matches!(tok, Token::RBracket)) {
            matching(t, sig, k - 1)
        } else if is(k - 1, word) {
            let mut j = k - 1;
            while j >= 2 && is(j - 1, |tok| matches!(tok, Token::Period)) && is(j - 2, word) {
                j -= 2;
            }
            Some(j)
        } else {
            None
        };
        // The right operand from k + 2: `[ … ]`, `ARRAY[ … ]`, `'[ … ]'`, or words joined by
        // periods.
        let r = k + 2;
        let array_keyword = sig.get(r).is_some_and(|&i| t.is_word(i, "ARRAY"))
            && is(r + 1, |tok| matches!(tok, Token::LBracket));
        let (last, text) = match sig.get(r).map(|&i| &t.tokens[i].token) {
            Some(Token::LBracket) => (matching(t, sig, r), None),
            Some(Token::Word(_)) if array_keyword => (matching(t, sig, r + 1), None),
            // pgvector's text form: numbers only, so the text stays a literal.
            Some(Token::SingleQuotedString(s))
                if s.trim_start().starts_with('[')
                    && s.trim_end().ends_with(']')
                    && s.chars().all(|c| {
                        c.is_ascii_digit() || c.is_ascii_whitespace() || "[],.+-eE".contains(c)
                    }) =>
            {
                (Some(r), Some(s.clone()))
            }
            Some(Token::Word(_)) => {
                let mut j = r;
                while is(j + 1, |tok| matches!(tok, Token::Period)) && is(j + 2, word) {
                    j += 2;
                }
                (Some(j), None)
            }
            _ => (None, None),
        };
        let (Some(first), Some(last)) = (first, last) else {
            k += 1;
            continue;
        };
        let span = |a: usize, b: usize| Some((t.start(sig[a])?, t.end(sig[b])?));
        if first < free {
            k += 1;
            continue;
        }
        if let (Some((ls, le)), Some((rs, re))) = (span(first, k - 1), span(r, last)) {
            let right = text.unwrap_or_else(|| t.sql[rs..re].to_string());
            edits.push((
                ls,
                re,
                format!("array_distance({}, {right})", &t.sql[ls..le]),
            ));
            free = last + 1;
        }
        k = last + 1;
    }
}

/// Where in `sig` the parenthesis or square bracket at `sig[at]` is matched: forward from an
/// opening one, backward from a closing one.
fn matching(t: &Tokens<'_>, sig: &[usize], at: usize) -> Option<usize> {
    let (open, close, forward) = match t.tokens[*sig.get(at)?].token {
        Token::LParen => (Token::LParen, Token::RParen, true),
        Token::RParen => (Token::LParen, Token::RParen, false),
        Token::LBracket => (Token::LBracket, Token::RBracket, true),
        Token::RBracket => (Token::LBracket, Token::RBracket, false),
        _ => return None,
    };
    let (inward, outward) = if forward {
        (open, close)
    } else {
        (close, open)
    };
    let steps: Box<dyn Iterator<Item = usize>> = if forward {
        Box::new(at..sig.len())
    } else {
        Box::new((0..=at).rev())
    };
    let mut depth = 0usize;
    for k in steps {
        let token = &t.tokens[sig[k]].token;
        if *token == inward {
            depth += 1;
        } else if *token == outward {
            depth -= 1;
            if depth == 0 {
                return Some(k);
            }
        }
    }
    None
}

/// `CACHE TABLE t SHARDED BY (a, b)`: the clause as an option.
fn sharded_by(
    t: &Tokens<'_>,
    sig: &[usize],
    edits: &mut Vec<(usize, usize, String)>,
) -> Result<()> {
    let Some(k) = (0..sig.len()).find(|&k| {
        t.is_word(sig[k], "SHARDED")
            && sig.get(k + 1).is_some_and(|&i| t.is_word(i, "BY"))
            && sig
                .get(k + 2)
                .is_some_and(|&i| matches!(t.tokens[i].token, Token::LParen))
    }) else {
        return Ok(());
    };
    let Some(close) = matching(t, sig, k + 2) else {
        return Ok(());
    };
    let columns: Vec<String> = sig[k + 3..close]
        .iter()
        .filter_map(|&i| match &t.tokens[i].token {
            Token::Word(w) => Some(w.value.replace('\'', "''")),
            _ => None,
        })
        .collect();
    if let (Some(start), Some(end)) = (t.start(sig[k]), t.end(sig[close])) {
        edits.push((
            start,
            end,
            format!("OPTIONS ('{SHARDED_BY_OPTION}' = '{}')", columns.join(",")),
        ));
    }
    Ok(())
}

fn create_stream(
    t: &Tokens<'_>,
    sig: &[usize],
    kind: usize,
    edits: &mut Vec<(usize, usize, String)>,
) -> Result<()> {
    let located = |k: usize| -> Result<(usize, usize)> {
        let i = sig[k];
        match (t.start(i), t.end(i)) {
            (Some(s), Some(e)) => Ok((s, e)),
            _ => Err(SpateError::Internal {
                message: "a token without a location in CREATE STREAM".into(),
            }),
        }
    };
    let (s, e) = located(kind)?;
    edits.push((s, e, "TABLE".into()));
    let open = (kind + 1..sig.len())
        .find(|&k| matches!(t.tokens[sig[k]].token, Token::LParen))
        .ok_or_else(|| sql_error("CREATE STREAM needs its columns in parentheses".into()))?;
    let close = matching(t, sig, open)
        .ok_or_else(|| sql_error("CREATE STREAM: unclosed parenthesis".into()))?;
    // The WATERMARK element: at depth 1, after `(` or `,`.
    let mut depth = 0usize;
    let mut watermark = None;
    for k in open..close {
        match t.tokens[sig[k]].token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ => {}
        }
        if depth == 1
            && t.is_word(sig[k], "WATERMARK")
            && matches!(t.tokens[sig[k - 1]].token, Token::LParen | Token::Comma)
        {
            watermark = Some(k);
        }
    }
    let Some(w) = watermark else {
        return Err(sql_error(
            "CREATE STREAM needs a watermark among its columns: WATERMARK FOR ts AS ts - \
             INTERVAL '5' SECOND"
                .into(),
        ));
    };
    // The element ends at the next comma at depth 1, or the closing parenthesis.
    let mut depth = 1usize;
    let mut end = close;
    for (k, &i) in sig.iter().enumerate().take(close).skip(w) {
        match t.tokens[i].token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Comma if depth == 1 => {
                end = k;
                break;
            }
            _ => {}
        }
    }
    let clause_start = located(w)?.0;
    let clause_end = located(end - 1)?.1;
    let clause = &t.sql[clause_start..clause_end];
    let (column, delay) = parse_watermark(t, &sig[w..end], clause)?;
    // Remove the element with one of the commas beside it.
    let (cut_start, cut_end) = if matches!(t.tokens[sig[w - 1]].token, Token::Comma) {
        (located(w - 1)?.0, clause_end)
    } else if end < close {
        // Up to the next element, so no space is left after the parenthesis.
        (clause_start, located(end + 1)?.0)
    } else {
        return Err(sql_error(
            "CREATE STREAM needs at least one column besides its WATERMARK".into(),
        ));
    };
    edits.push((cut_start, cut_end, String::new()));
    let ours = format!(
        "{STREAM_OPTION} = '{}', {DELAY_OPTION} = '{delay}'",
        column.replace('\'', "''")
    );
    if close + 2 < sig.len()
        && t.is_word(sig[close + 1], "WITH")
        && matches!(t.tokens[sig[close + 2]].token, Token::LParen)
    {
        let at = located(close + 2)?.1;
        let empty =
            close + 3 < sig.len() && matches!(t.tokens[sig[close + 3]].token, Token::RParen);
        edits.push((at, at, if empty { ours } else { format!("{ours}, ") }));
    } else {
        let at = located(close)?.1;
        edits.push((at, at, format!(" WITH ({ours})")));
    }
    Ok(())
}

/// `WATERMARK FOR col AS col [- INTERVAL …]`: the column and the delay in microseconds.
fn parse_watermark(t: &Tokens<'_>, sig: &[usize], clause: &str) -> Result<(String, i64)> {
    let usage = || {
        sql_error(format!(
            "cannot read `{clause}`: write WATERMARK FOR ts AS ts - INTERVAL '5' SECOND"
        ))
    };
    let name = |i: usize| match &t.tokens[i].token {
        Token::Word(w) => Some(w.value.clone()),
        _ => None,
    };
    if sig.len() < 4 || !t.is_word(sig[1], "FOR") || !t.is_word(sig[3], "AS") {
        return Err(usage());
    }
    let column = name(sig[2]).ok_or_else(usage)?;
    let again = sig.get(4).and_then(|&i| name(i)).ok_or_else(usage)?;
    if !again.eq_ignore_ascii_case(&column) {
        return Err(sql_error(format!(
            "the watermark of `{column}` must be `{column}` less an interval, not `{again}`"
        )));
    }
    if sig.len() == 5 {
        return Ok((column, 0));
    }
    if !matches!(t.tokens[sig[5]].token, Token::Minus) || sig.len() < 7 {
        return Err(usage());
    }
    let from = t.start(sig[6]).ok_or_else(usage)?;
    let to = t.end(*sig.last().ok_or_else(usage)?).ok_or_else(usage)?;
    let delay = parse_duration_micros(&t.sql[from..to])?;
    Ok((column, delay))
}

fn create_continuous_view(
    t: &Tokens<'_>,
    sig: &[usize],
    kind: usize,
    edits: &mut Vec<(usize, usize, String)>,
) -> Result<()> {
    let at = |k: usize| -> Result<(usize, usize)> {
        match (t.start(sig[k]), t.end(sig[k])) {
            (Some(s), Some(e)) => Ok((s, e)),
            _ => Err(SpateError::Internal {
                message: "a token without a location in CREATE CONTINUOUS VIEW".into(),
            }),
        }
    };
    // `CONTINUOUS ` goes, up to `VIEW`.
    edits.push((at(kind)?.0, at(kind + 1)?.0, String::new()));
    // The emit clause: the last `EMIT ON …` at depth 0.
    let mut depth = 0usize;
    let mut emit = None;
    for (k, &i) in sig.iter().enumerate() {
        match t.tokens[i].token {
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 && t.is_word(i, "EMIT") {
            emit = Some(k);
        }
    }
    let mode = match emit {
        None => "close",
        Some(k) => {
            let rest: Vec<String> = sig[k + 1..]
                .iter()
                .map(|&i| t.tokens[i].token.to_string().to_ascii_uppercase())
                .collect();
            let mode = match rest.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                ["ON", "WINDOW", "CLOSE"] => "close",
                ["ON", "UPDATE"] => "update",
                _ => {
                    return Err(sql_error(
                        "a continuous view ends with EMIT ON WINDOW CLOSE or EMIT ON UPDATE".into(),
                    ));
                }
            };
            let end = at(sig.len() - 1)?.1;
            edits.push((at(k)?.0, end, String::new()));
            mode
        }
    };
    let ours = format!("{EMIT_OPTION} = '{mode}'");
    // The options go before `AS`, inside a `WITH (…)` already there.
    let view = kind + 1;
    let as_at = (view + 1..sig.len())
        .find(|&k| t.is_word(sig[k], "AS") || t.is_word(sig[k], "WITH"))
        .ok_or_else(|| sql_error("CREATE CONTINUOUS VIEW v AS SELECT …: no AS".into()))?;
    if t.is_word(sig[as_at], "WITH")
        && as_at + 1 < sig.len()
        && matches!(t.tokens[sig[as_at + 1]].token, Token::LParen)
    {
        let after = at(as_at + 1)?.1;
        let empty =
            as_at + 2 < sig.len() && matches!(t.tokens[sig[as_at + 2]].token, Token::RParen);
        edits.push((after, after, if empty { ours } else { format!("{ours}, ") }));
    } else {
        let before = at(as_at)?.0;
        edits.push((before, before, format!("WITH ({ours}) ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;

    fn rewritten(sql: &str) -> String {
        rewrite(sql, &GenericDialect {}).unwrap().into_owned()
    }

    #[test]
    fn the_distance_operator_becomes_array_distance() {
        assert_eq!(
            rewritten("SELECT id FROM items ORDER BY emb <-> [1.5, -2] LIMIT 5"),
            "SELECT id FROM items ORDER BY array_distance(emb, [1.5, -2]) LIMIT 5"
        );
        assert_eq!(
            rewritten("SELECT i.emb<->'[1,2]' AS d FROM items i WHERE i.emb <-> q.v < 3"),
            "SELECT array_distance(i.emb, [1,2]) AS d FROM items i WHERE array_distance(i.emb, q.v) < 3"
        );
        assert_eq!(
            rewritten("SELECT e <-> ARRAY[1, 2] FROM t"),
            "SELECT array_distance(e, ARRAY[1, 2]) FROM t"
        );
        assert_eq!(
            rewritten("SELECT [0.0, [1]] <-> \"Emb\" FROM t"),
            "SELECT array_distance([0.0, [1]], \"Emb\") FROM t"
        );
        // Not the operator: `<` then `->` apart, inside a string, or operands it does not
        // take (left to the parser), and a chain whose second operator would overlap.
        for sql in [
            "SELECT a < -> b",
            "SELECT '<->' FROM t",
            "SELECT f(x) <-> [1] FROM t",
            "SELECT a <-> 1 FROM t",
            "SELECT a <-> '[1]) OR ([1]' FROM t",
        ] {
            assert_eq!(rewritten(sql), sql);
        }
        assert_eq!(
            rewritten("SELECT a <-> b <-> c"),
            "SELECT array_distance(a, b) <-> c"
        );
    }

    #[test]
    fn create_stream_becomes_a_table_with_its_watermark_as_options() {
        assert_eq!(
            rewritten(
                "CREATE STREAM tx (card BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)"
            ),
            "CREATE TABLE tx (card BIGINT, ts TIMESTAMP) WITH (spate_stream = 'ts', \
             spate_watermark_delay = '5000000')"
        );
        assert_eq!(
            rewritten(
                "create stream s (WATERMARK FOR t AS t, t TIMESTAMP) with (lateness = '1s');"
            ),
            "create TABLE s (t TIMESTAMP) with (spate_stream = 't', \
             spate_watermark_delay = '0', lateness = '1s');"
        );
        let e = rewrite("CREATE STREAM s (t TIMESTAMP)", &GenericDialect {}).unwrap_err();
        assert!(e.to_string().contains("WATERMARK FOR"), "{e}");
        let e = rewrite(
            "CREATE STREAM s (t TIMESTAMP, WATERMARK FOR t AS u - INTERVAL '1' SECOND)",
            &GenericDialect {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("must be `t`"), "{e}");
    }

    #[test]
    fn continuous_views_keep_their_query_and_name_their_emit_mode() {
        assert_eq!(
            rewritten("CREATE CONTINUOUS VIEW v AS SELECT 1 EMIT ON UPDATE"),
            "CREATE VIEW v WITH (spate_emit = 'update') AS SELECT 1 "
        );
        assert_eq!(
            rewritten("CREATE CONTINUOUS VIEW v AS SELECT 'emit' FROM t"),
            "CREATE VIEW v WITH (spate_emit = 'close') AS SELECT 'emit' FROM t"
        );
        assert!(
            rewrite(
                "CREATE CONTINUOUS VIEW v AS SELECT 1 EMIT NOW",
                &GenericDialect {}
            )
            .is_err()
        );
        assert_eq!(
            rewritten("CHECKPOINT 'ckpt/c'; RESTORE 'c'"),
            "SET spate_checkpoint = 'ckpt/c'; SET spate_restore = 'c'"
        );
        assert!(rewrite("CHECKPOINT", &GenericDialect {}).is_err());
        assert_eq!(
            rewritten("cache table t sharded by (a, \"B\") -- shards\n; SELECT 'sharded by (x)'"),
            "cache table t OPTIONS ('spate.sharded_by' = 'a,B') -- shards\n; SELECT 'sharded by (x)'"
        );
        // Other statements pass untouched.
        assert_eq!(rewritten("SELECT stream FROM s"), "SELECT stream FROM s");
    }
}
